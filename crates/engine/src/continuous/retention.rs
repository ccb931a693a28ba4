//! Retention: finished jobs leave the table in batches once their retention
//! has passed, oldest first (by `updated_at`, ties by key), by one holder at
//! a time per queue (a transaction-level advisory lock no claim takes).
//! Only finished jobs: the delete re-checks the status of every row it
//! removes, after locking it, so a job replayed or still running is never
//! removed. A row the delete leaves (an application's `BEFORE DELETE`
//! trigger returning NULL, as settled's payout jobs do while their payout is
//! queued) does not stop a prune: each batch starts after the last job the
//! previous one picked, so one prune walks past every kept row to the
//! expired jobs after it, and the next prune starts again from the oldest.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::{Names, Queue};
use crate::common::error::EngineError;

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
    /// A prune's first batch: the oldest expired finished jobs.
    first: String,
    /// A later batch: those after the previous batch's last, `($4, $5)`.
    after: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, key, key_type) = (n.table, n.key, n.key_type);
        let expired = "(t.status IN ('settled', 'cancelled') AND t.updated_at < now() - $1 * interval '1 millisecond')
                    OR (t.status = 'failed' AND t.updated_at < now() - $2 * interval '1 millisecond')";
        // Candidates in (updated_at, key) order, the order the cursor
        // compares in; the `>=` bounds the scan of the finished index
        // (on updated_at), the row comparison breaks ties by key. The
        // statement returns how many it picked, how many it deleted (a
        // trigger may keep some) and the last it picked.
        let batch = |after: &str| {
            format!(
                "WITH old AS MATERIALIZED (
                     SELECT t.{key} AS key, t.updated_at FROM {table} t
                     WHERE t.status IN ('settled', 'failed', 'cancelled') AND ({expired}){after}
                     ORDER BY t.updated_at, t.{key}
                     LIMIT $3
                     FOR UPDATE OF t SKIP LOCKED),
                 gone AS (
                     DELETE FROM {table} t
                     USING old
                     WHERE t.{key} = old.key AND ({expired})
                     RETURNING 1),
                 last AS (
                     SELECT old.updated_at, old.key::text AS key FROM old
                     ORDER BY old.updated_at DESC, old.key DESC
                     LIMIT 1)
                 SELECT (SELECT count(*) FROM old) AS picked,
                        (SELECT count(*) FROM gone) AS deleted,
                        (SELECT last.updated_at FROM last) AS last_at,
                        (SELECT last.key FROM last) AS last_key"
            )
        };
        Sql {
            first: batch(""),
            after: batch(&format!(
                "
                       AND t.updated_at >= $4 AND (t.updated_at, t.{key}) > ($4, CAST($5 AS {key_type}))"
            )),
        }
    }
}

/// Where a prune's next batch starts: after the last job the previous
/// batch picked (deleted or kept).
#[derive(Debug, Clone)]
struct PruneCursor {
    updated_at: DateTime<Utc>,
    /// The key as text, cast back to the key's type by the statement.
    key: String,
}

/// What one retention batch did.
#[derive(Debug)]
struct PruneBatch {
    /// Expired finished jobs it picked and locked (at most [`PRUNE_BATCH_JOBS`]).
    picked: u64,
    /// Those it deleted: fewer when a trigger kept some, or a job changed.
    deleted: u64,
    /// The last it picked, where the next batch starts (None if none).
    last: Option<PruneCursor>,
}

#[derive(sqlx::FromRow)]
struct BatchRow {
    picked: i64,
    deleted: i64,
    last_at: Option<DateTime<Utc>>,
    last_key: Option<String>,
}

impl Queue {
    /// Removes finished jobs past `retention`, batch by batch, oldest first,
    /// unless another worker is pruning this queue (then returns None). A
    /// batch that picked a full batch (5,000 jobs) is followed by one
    /// starting after its last job, whether it deleted them or a trigger
    /// kept them, so rows that are never deleted do not hide those after.
    pub async fn prune(&self, pool: &PgPool, retention: &Retention) -> Result<Option<u64>, EngineError> {
        let mut removed = 0;
        let mut after: Option<PruneCursor> = None;
        loop {
            let mut tx = pool.begin().await.map_err(EngineError::db("beginning a prune"))?;
            if !self.prune_lock(&mut tx).await? {
                return Ok((removed > 0).then_some(removed));
            }
            let batch = self.prune_batch(&mut tx, retention, after.as_ref()).await?;
            tx.commit().await.map_err(EngineError::db("committing a prune"))?;
            removed += batch.deleted;
            match batch.last {
                Some(last) if batch.picked >= PRUNE_BATCH_JOBS as u64 => after = Some(last),
                _ => return Ok(Some(removed)),
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

    /// Removes one batch of expired finished jobs on `tx`: the oldest, or
    /// those after `after`.
    async fn prune_batch(
        &self,
        tx: &mut PgConnection,
        retention: &Retention,
        after: Option<&PruneCursor>,
    ) -> Result<PruneBatch, EngineError> {
        let sql = &self.sql.retention;
        let query = sqlx::query_as::<_, BatchRow>(if after.is_some() { &sql.after } else { &sql.first })
            .bind(retention.finished.as_millis() as i64) // $1
            .bind(retention.failed.as_millis() as i64) // $2
            .bind(PRUNE_BATCH_JOBS); // $3
        let query = match after {
            Some(c) => query.bind(c.updated_at).bind(&c.key), // $4, $5
            None => query,
        };
        let row = query
            .fetch_one(tx)
            .await
            .map_err(EngineError::db("pruning finished jobs"))?;
        let last = match (row.last_at, row.last_key) {
            (Some(updated_at), Some(key)) => Some(PruneCursor { updated_at, key }),
            _ => None,
        };
        Ok(PruneBatch {
            picked: row.picked as u64,
            deleted: row.deleted as u64,
            last,
        })
    }
}
