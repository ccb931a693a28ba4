//! Completing: the status changes that end an item's work for the run,
//! `settled` or `held`. In-transaction mode re-checks the status inside the
//! claiming transaction; leased mode carries the fence.

use sqlx::PgConnection;

use super::scope::ScopeArg;
use super::{keys_and_fences, Names, WorkQueue};
use crate::common::error::EngineError;
use crate::common::fence::ROW_FENCE;
use crate::common::item::ClaimedItem;

#[derive(Debug, Clone)]
pub(super) struct Sql {
    settled_in_tx: String,
    held_in_tx: String,
    settled_fenced: String,
    held_fenced: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type, key, key_type) = (n.table, n.scope, n.scope_type, n.key, n.key_type);
        Sql {
            settled_in_tx: format!(
                "UPDATE {table}
                 SET status = 'settled', attempt = attempt + 1, lease_owner = NULL,
                     lease_until = NULL, last_error = NULL, not_before = NULL, updated_at = now()
                 WHERE {scope} = CAST($1 AS {scope_type})
                   AND {key} = ANY(CAST($2 AS {key_type}[]))
                   AND status = 'eligible'"
            ),
            // Items the application put on hold: not worked on in this run.
            held_in_tx: format!(
                "UPDATE {table}
                 SET status = 'held', attempt = attempt + 1, lease_owner = NULL,
                     lease_until = NULL, updated_at = now()
                 WHERE {scope} = CAST($1 AS {scope_type})
                   AND {key} = ANY(CAST($2 AS {key_type}[]))
                   AND status = 'eligible'"
            ),
            // The fenced write: only the claim that holds the item's current
            // attempt can complete it. Returns the keys it accepted.
            settled_fenced: format!(
                "UPDATE {table} t
                 SET status = 'settled', lease_owner = NULL, lease_until = NULL,
                     last_error = NULL, not_before = NULL, updated_at = now()
                 FROM unnest(CAST($2 AS {key_type}[]), CAST($3 AS bigint[])) AS f(key, fence)
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{key} = f.key AND {ROW_FENCE} = f.fence AND t.status = 'processing'
                 RETURNING t.{key}::text AS key"
            ),
            held_fenced: format!(
                "UPDATE {table} t
                 SET status = 'held', lease_owner = NULL, lease_until = NULL, updated_at = now()
                 FROM unnest(CAST($2 AS {key_type}[]), CAST($3 AS bigint[])) AS f(key, fence)
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{key} = f.key AND {ROW_FENCE} = f.fence AND t.status = 'processing'"
            ),
        }
    }
}

impl WorkQueue {
    /// The in-transaction completion's text (see [`WorkQueue::claim_in_tx_sql`]).
    pub fn mark_settled_in_tx_sql(&self) -> &str {
        &self.sql.complete.settled_in_tx
    }

    /// Marks claimed items `settled` in the claiming transaction. Fails (and
    /// the caller must roll back) unless every item is still `eligible`.
    pub async fn mark_settled_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        keys: &[String],
    ) -> Result<(), EngineError> {
        mark_every_claimed(
            tx,
            &self.sql.complete.settled_in_tx,
            self.scope_arg(scope)?,
            keys,
            "settled",
        )
        .await
    }

    /// In-transaction mode: marks claimed items `held` (the application
    /// refuses to work on them now). Fails unless every item is still eligible.
    pub async fn mark_held_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        keys: &[String],
    ) -> Result<(), EngineError> {
        mark_every_claimed(tx, &self.sql.complete.held_in_tx, self.scope_arg(scope)?, keys, "held").await
    }

    /// The fenced completion: marks `settled` exactly those items whose
    /// attempt still equals the fence they were claimed with. Returns the
    /// accepted keys; the caller writes the effects of those only, in the
    /// same transaction.
    pub async fn complete_fenced(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        items: &[ClaimedItem],
    ) -> Result<Vec<String>, EngineError> {
        let (keys, fences) = keys_and_fences(items);
        sqlx::query_scalar(&self.sql.complete.settled_fenced)
            .bind(self.scope_arg(scope)?) // $1
            .bind(keys) // $2
            .bind(fences) // $3
            .fetch_all(tx)
            .await
            .map_err(EngineError::db("completing fenced items"))
    }

    /// Leased mode: marks items `held` if their fence still holds.
    pub async fn hold_fenced(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        items: &[ClaimedItem],
    ) -> Result<u64, EngineError> {
        let (keys, fences) = keys_and_fences(items);
        Ok(sqlx::query(&self.sql.complete.held_fenced)
            .bind(self.scope_arg(scope)?) // $1
            .bind(keys) // $2
            .bind(fences) // $3
            .execute(conn)
            .await
            .map_err(EngineError::db("marking leased items held"))?
            .rows_affected())
    }
}

/// Runs a status change on claimed items; anything but exactly one row per
/// key means the claim did not hold, and the caller must roll back.
async fn mark_every_claimed(
    tx: &mut PgConnection,
    sql: &str,
    scope: ScopeArg,
    keys: &[String],
    status: &str,
) -> Result<(), EngineError> {
    let done = sqlx::query(sql)
        .bind(scope) // $1
        .bind(keys) // $2
        .execute(tx)
        .await
        .map_err(EngineError::db("marking claimed items"))?
        .rows_affected();
    if done != keys.len() as u64 {
        return Err(EngineError::Invariant(format!(
            "marked {done} of {} claimed items {status}; rolling the chunk back",
            keys.len()
        )));
    }
    Ok(())
}
