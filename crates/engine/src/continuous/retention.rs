//! Retention: finished jobs leave the table in batches once their retention
//! has passed, oldest first, by one holder at a time per queue (a
//! transaction-level advisory lock no claim takes). Only finished jobs:
//! the delete re-checks the status of every row it removes, after locking
//! it, so a job replayed or still running is never removed.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use super::{Names, Queue};
use crate::EngineError;

/// Most jobs one retention statement removes (each batch its own transaction).
pub(super) const PRUNE_BATCH_JOBS: i64 = 5_000;

/// How long finished jobs stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Settled and cancelled jobs, after they finished. A key enqueued again
    /// within this window is refused as a duplicate.
    pub finished: Duration,
    /// Dead letters (`failed` jobs), after they failed.
    pub failed: Duration,
    /// How often a worker tries to prune.
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            finished: Duration::from_secs(24 * 3600),
            failed: Duration::from_secs(30 * 24 * 3600),
            interval: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Sql {
    prune: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, key) = (n.table, n.key);
        let expired = "(t.status IN ('settled', 'cancelled') AND t.updated_at < now() - $1 * interval '1 millisecond')
                    OR (t.status = 'failed' AND t.updated_at < now() - $2 * interval '1 millisecond')";
        Sql {
            prune: format!(
                "WITH old AS MATERIALIZED (
                     SELECT t.{key} AS key FROM {table} t
                     WHERE t.status IN ('settled', 'failed', 'cancelled') AND ({expired})
                     ORDER BY t.updated_at
                     LIMIT $3
                     FOR UPDATE OF t SKIP LOCKED)
                 DELETE FROM {table} t
                 USING old
                 WHERE t.{key} = old.key AND ({expired})"
            ),
        }
    }
}

impl Queue {
    /// Removes finished jobs past `retention`, batch by batch, unless
    /// another worker is pruning this queue (then returns None).
    pub async fn prune(&self, pool: &PgPool, retention: &Retention) -> Result<Option<u64>, EngineError> {
        let mut removed = 0;
        loop {
            let mut tx = pool.begin().await.map_err(EngineError::db("beginning a prune"))?;
            if !self.prune_lock(&mut tx).await? {
                return Ok((removed > 0).then_some(removed));
            }
            let batch = self.prune_batch(&mut tx, retention).await?;
            tx.commit().await.map_err(EngineError::db("committing a prune"))?;
            removed += batch;
            if batch < PRUNE_BATCH_JOBS as u64 {
                return Ok(Some(removed));
            }
        }
    }

    /// One holder per queue, for the transaction.
    async fn prune_lock(&self, tx: &mut PgConnection) -> Result<bool, EngineError> {
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('settled-engine-prune'), hashtext($1))")
            .bind(&self.name) // $1
            .fetch_one(tx)
            .await
            .map_err(EngineError::db("taking the prune lock"))
    }

    /// Removes one batch of expired finished jobs on `tx`.
    pub(crate) async fn prune_batch(&self, tx: &mut PgConnection, retention: &Retention) -> Result<u64, EngineError> {
        Ok(sqlx::query(&self.sql.retention.prune)
            .bind(retention.finished.as_millis() as i64) // $1
            .bind(retention.failed.as_millis() as i64) // $2
            .bind(PRUNE_BATCH_JOBS) // $3
            .execute(tx)
            .await
            .map_err(EngineError::db("pruning finished jobs"))?
            .rows_affected())
    }
}
