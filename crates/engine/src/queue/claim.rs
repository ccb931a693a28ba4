//! Claiming: the statements that take items for a worker, never waiting for
//! another worker (`FOR NO KEY UPDATE SKIP LOCKED`), and return each item's
//! fence.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::{fetch_items, Names, WorkQueue, MAX_CHUNK_ITEMS};
use crate::fence::ROW_FENCE;
use crate::{ClaimedItem, EngineError};

#[derive(Debug, Clone)]
pub(super) struct Sql {
    in_tx: String,
    in_tx_after: String,
    start_key: String,
    keys_in_tx: String,
    leased: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type, key, key_type) = n.parts();
        Sql {
            // In-transaction mode: the row locks are the claim, held until
            // commit; the status is re-checked when the items are marked.
            // Locking rows straight from the SELECT (no `key IN (subquery)`)
            // locks exactly the rows returned, never more. The fence is the
            // attempt the commit will write.
            in_tx: format!(
                "SELECT t.{key}::text AS key, (t.attempt + 1)::bigint AS fence
                 FROM {table} t
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.status = 'eligible'
                   AND (t.not_before IS NULL OR t.not_before <= now())
                   AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running')
                 LIMIT $2
                 FOR NO KEY UPDATE OF t SKIP LOCKED"
            ),
            // The same claim from a claim loop's cursor, in key order: a loop
            // goes on from where its last chunk ended instead of scanning
            // again, from the start of the index, past every row other
            // loops hold and every entry settled rows left behind (which a
            // snapshot held elsewhere keeps from being cleaned).
            in_tx_after: format!(
                "SELECT t.{key}::text AS key, (t.attempt + 1)::bigint AS fence
                 FROM {table} t
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.status = 'eligible'
                   AND t.{key} > CAST($4 AS {key_type})
                   AND (t.not_before IS NULL OR t.not_before <= now())
                   AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running')
                 ORDER BY t.{key}
                 LIMIT $2
                 FOR NO KEY UPDATE OF t SKIP LOCKED"
            ),
            // A random boundary of the planner's histogram of the scope's
            // keys (its partition's, when partitioned): where a claim loop
            // starts, so loops spread over the key space. NULL without
            // statistics.
            start_key: format!(
                "SELECT b[1 + floor(random() * cardinality(b))::int]
                 FROM (SELECT s.histogram_bounds::text::text[] AS b
                       FROM pg_stats s
                       JOIN pg_class c ON c.relname = s.tablename
                       JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
                       WHERE c.oid = (SELECT t.tableoid FROM {table} t
                                      WHERE t.{scope} = CAST($1 AS {scope_type}) LIMIT 1)
                         AND s.attname = $2 AND NOT s.inherited) h
                 WHERE cardinality(b) > 0"
            ),
            // Re-locks chosen keys (retrying halves of a failed chunk).
            keys_in_tx: format!(
                "SELECT t.{key}::text AS key, (t.attempt + 1)::bigint AS fence
                 FROM {table} t
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{key} = ANY(CAST($2 AS {key_type}[]))
                   AND t.status = 'eligible'
                 FOR NO KEY UPDATE OF t SKIP LOCKED"
            ),
            // Leased mode: a short transaction of its own claims and commits
            // the lease; the CTE is joined back on the key and the status
            // re-checked.
            leased: format!(
                "WITH picked AS (
                     SELECT t.{scope} AS scope, t.{key} AS key
                     FROM {table} t
                     WHERE t.{scope} = CAST($1 AS {scope_type})
                       AND t.status = 'eligible'
                       AND (t.not_before IS NULL OR t.not_before <= now())
                       AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running')
                     LIMIT $2
                     FOR NO KEY UPDATE OF t SKIP LOCKED)
                 UPDATE {table} t
                 SET status = 'processing', attempt = t.attempt + 1, lease_owner = $4,
                     lease_until = now() + $5 * interval '1 millisecond', updated_at = now(),
                     fence_epoch = settled_engine.fence_epoch()
                 FROM picked
                 WHERE t.{scope} = picked.scope AND t.{key} = picked.key AND t.status = 'eligible'
                 RETURNING t.{key}::text AS key, {ROW_FENCE} AS fence"
            ),
        }
    }
}

impl WorkQueue {
    /// The in-transaction claim's text (for tools that must send exactly
    /// the engine's statement, such as a pgbench script check).
    pub fn claim_in_tx_sql(&self) -> &str {
        &self.sql.claim.in_tx
    }

    /// Locks up to `limit` eligible items of `scope` for the current
    /// transaction, skipping rows other transactions hold. Returns nothing
    /// when run `run_id` is not running.
    pub async fn claim_chunk_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        limit: u32,
        run_id: i64,
    ) -> Result<Vec<ClaimedItem>, EngineError> {
        debug_assert!((1..=MAX_CHUNK_ITEMS).contains(&limit));
        let query = sqlx::query_as(&self.sql.claim.in_tx)
            .bind(scope) // $1
            .bind(i64::from(limit)) // $2
            .bind(run_id); // $3
        fetch_items(query, tx, "claiming a chunk").await
    }

    /// [`Self::claim_chunk_in_tx`] for keys after `after` only, in key order.
    pub async fn claim_chunk_in_tx_after(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        limit: u32,
        run_id: i64,
        after: &str,
    ) -> Result<Vec<ClaimedItem>, EngineError> {
        debug_assert!((1..=MAX_CHUNK_ITEMS).contains(&limit));
        let query = sqlx::query_as(&self.sql.claim.in_tx_after)
            .bind(scope) // $1
            .bind(i64::from(limit)) // $2
            .bind(run_id) // $3
            .bind(after); // $4
        fetch_items(query, tx, "claiming a chunk after a key").await
    }

    /// Where a claim loop starts: a random key among the planner's histogram
    /// bounds of `scope`'s keys, or None (no statistics, no items).
    pub async fn random_start_key(&self, conn: &mut PgConnection, scope: &str) -> Result<Option<String>, EngineError> {
        let key: Option<Option<String>> = sqlx::query_scalar(&self.sql.claim.start_key)
            .bind(scope) // $1
            .bind(&self.spec.key_column) // $2
            .fetch_optional(conn)
            .await
            .map_err(EngineError::db("choosing where a claim loop starts"))?;
        Ok(key.flatten())
    }

    /// Re-locks the still-eligible items among `keys` in the current
    /// transaction (skipping any another transaction holds).
    pub async fn lock_keys_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        keys: &[String],
    ) -> Result<Vec<ClaimedItem>, EngineError> {
        let query = sqlx::query_as(&self.sql.claim.keys_in_tx)
            .bind(scope) // $1
            .bind(keys); // $2
        fetch_items(query, tx, "re-locking items").await
    }

    /// Leased mode: claims up to `limit` items and commits their leases
    /// (`processing`, owner, expiry `now() + ttl` on the database clock,
    /// `attempt + 1`). Returns each item's key and fence.
    pub async fn claim_leased(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        limit: u32,
        run_id: i64,
        worker: Uuid,
        ttl: Duration,
    ) -> Result<Vec<ClaimedItem>, EngineError> {
        debug_assert!((1..=MAX_CHUNK_ITEMS).contains(&limit));
        let query = sqlx::query_as(&self.sql.claim.leased)
            .bind(scope) // $1
            .bind(i64::from(limit)) // $2
            .bind(run_id) // $3
            .bind(worker) // $4
            .bind(ttl.as_millis() as i64); // $5
        fetch_items(query, conn, "claiming a leased chunk").await
    }
}
