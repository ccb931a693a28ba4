//! Claiming: the statements that take items for a worker, never waiting for
//! another worker (`FOR NO KEY UPDATE SKIP LOCKED`), and return each item's
//! fence.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::{fetch_items, KeyWindow, Names, WindowShape, WorkQueue, MAX_CHUNK_ITEMS};
use crate::common::error::EngineError;
use crate::common::fence::ROW_FENCE;
use crate::common::item::ClaimedItem;

#[derive(Debug, Clone)]
pub(super) struct Sql {
    in_tx: [String; 4],
    key_bounds: String,
    keys_in_tx: String,
    leased: String,
}

/// What may be claimed now, the one home of that rule: an item (alias
/// `t`) of the scope `$1` that is eligible, not waiting out a backoff, of
/// the run `$3` while it is running. Every claim (in-transaction, leased,
/// the one-statement chunk) selects with it.
pub(super) fn claimable(n: &Names) -> String {
    let (scope, scope_type) = (n.scope, n.scope_type);
    format!(
        "t.{scope} = CAST($1 AS {scope_type})
                   AND t.status = 'eligible'
                   AND (t.not_before IS NULL OR t.not_before <= now())
                   AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running')"
    )
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type, key, key_type) = (n.table, n.scope, n.scope_type, n.key, n.key_type);
        let claimable = claimable(n);
        Sql {
            // In-transaction mode: the row locks are the claim, held until
            // commit; the status is re-checked when the items are marked.
            // Locking rows straight from the SELECT (no `key IN (subquery)`)
            // locks exactly the rows returned, never more. The fence is the
            // attempt the commit will write. One statement per window shape:
            // a claim loop claims within its key range from where its last
            // chunk ended, in key order, instead of scanning again from the
            // start of the index past every row other loops hold and every
            // entry settled rows left behind (which a snapshot held elsewhere
            // keeps from being cleaned).
            in_tx: WindowShape::ALL.map(|shape| {
                let (window, order) = n.window(shape);
                format!(
                    "SELECT t.{key}::text AS key, (t.attempt + 1)::bigint AS fence
                 FROM {table} t
                 WHERE {claimable}{window}{order}
                 LIMIT $2
                 FOR NO KEY UPDATE OF t SKIP LOCKED"
                )
            }),
            // The planner's histogram of the scope's keys (its partition's,
            // when partitioned), as text in key order, and the relation's
            // estimated rows: where claim loops cut the key space into
            // ranges. No row without items; empty bounds without statistics.
            key_bounds: format!(
                "SELECT coalesce(h.b, '{{}}') AS bounds, greatest(c.reltuples, 0)::float8 AS rows
                 FROM (SELECT t.tableoid AS rel FROM {table} t
                       WHERE t.{scope} = CAST($1 AS {scope_type}) LIMIT 1) r
                 JOIN pg_class c ON c.oid = r.rel
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 LEFT JOIN LATERAL (
                     SELECT s.histogram_bounds::text::text[] AS b
                     FROM pg_stats s
                     WHERE s.schemaname = n.nspname AND s.tablename = c.relname
                       AND s.attname = $2 AND NOT s.inherited) h ON true"
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
                     WHERE {claimable}
                     LIMIT $2
                     FOR NO KEY UPDATE OF t SKIP LOCKED)
                 UPDATE {table} t
                 SET status = 'processing', attempt = t.attempt + 1, lease_owner = $4,
                     lease_until = now() + $5 * interval '1 millisecond', updated_at = now(),
                     fence_epoch = settled_engine.fence_epoch()
                 FROM picked
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{scope} = picked.scope AND t.{key} = picked.key AND t.status = 'eligible'
                 RETURNING t.{key}::text AS key, {ROW_FENCE} AS fence"
            ),
        }
    }
}

impl WorkQueue {
    /// The in-transaction claim's text (for tools that must send exactly
    /// the engine's statement, such as a pgbench script check).
    pub fn claim_in_tx_sql(&self) -> &str {
        &self.sql.claim.in_tx[KeyWindow::ALL.shape().index()]
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
        self.claim_chunk_in_tx_window(tx, scope, limit, run_id, KeyWindow::ALL)
            .await
    }

    /// [`Self::claim_chunk_in_tx`] for the keys of `window` only (in key
    /// order when it has a bound).
    pub async fn claim_chunk_in_tx_window(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        limit: u32,
        run_id: i64,
        window: KeyWindow<'_>,
    ) -> Result<Vec<ClaimedItem>, EngineError> {
        debug_assert!((1..=MAX_CHUNK_ITEMS).contains(&limit));
        let query = sqlx::query_as(&self.sql.claim.in_tx[window.shape().index()])
            .bind(self.scope_arg(scope)?) // $1
            .bind(i64::from(limit)) // $2
            .bind(run_id); // $3
        fetch_items(window.bind(query), tx, "claiming a chunk").await
    }

    /// Keys that cut `scope`'s key space into ranges of about `min_rows`
    /// rows or more, in key order, taken from the planner's histogram of
    /// the keys (empty without statistics, or when the scope is smaller
    /// than two such ranges). With bounds `b`, range 0 holds the keys up to
    /// `b[0]`, range `i` those after `b[i-1]` up to `b[i]`, the last those
    /// after the last bound: every key falls in exactly one range.
    pub async fn key_ranges(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        min_rows: u64,
    ) -> Result<Vec<String>, EngineError> {
        let row: Option<(Vec<String>, f64)> = sqlx::query_as(&self.sql.claim.key_bounds)
            .bind(self.scope_arg(scope)?) // $1
            .bind(&self.spec.key_column) // $2
            .fetch_optional(conn)
            .await
            .map_err(EngineError::db("reading the histogram of a scope's keys"))?;
        Ok(row.map_or_else(Vec::new, |(bounds, rows)| coarsen(bounds, rows, min_rows)))
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
            .bind(self.scope_arg(scope)?) // $1
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
            .bind(self.scope_arg(scope)?) // $1
            .bind(i64::from(limit)) // $2
            .bind(run_id) // $3
            .bind(worker) // $4
            .bind(ttl.as_millis() as i64); // $5
        fetch_items(query, conn, "claiming a leased chunk").await
    }
}

/// Keeps every `step`-th of a histogram's `bounds` so that each of the
/// ranges they cut holds about `min_rows` of the relation's estimated `rows`
/// or more (the histogram's buckets hold equal shares of the rows).
fn coarsen(bounds: Vec<String>, rows: f64, min_rows: u64) -> Vec<String> {
    let buckets = bounds.len() + 1;
    let wanted = (rows / min_rows.max(1) as f64).floor().clamp(1.0, buckets as f64) as usize;
    if wanted <= 1 {
        return Vec::new();
    }
    let step = buckets.div_ceil(wanted);
    bounds
        .into_iter()
        .enumerate()
        .filter(|(i, _)| (i + 1) % step == 0)
        .map(|(_, b)| b)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::coarsen;

    fn bounds(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("k{i:03}")).collect()
    }

    #[test]
    fn coarsen_keeps_ranges_of_at_least_the_rows_asked() {
        // 101 bounds (102 buckets) over a million rows, ranges of 10,000 or more.
        let kept = coarsen(bounds(101), 1_000_000.0, 10_000);
        assert_eq!(kept.len(), 50);
        assert_eq!(kept[0], "k001");
        assert_eq!(kept[1], "k003");
        // Ranges of 20,000 or more: 50 wanted of 102 buckets, every third bound.
        let kept = coarsen(bounds(101), 1_000_000.0, 20_000);
        assert_eq!(kept.len(), 33);
        assert_eq!(kept[0], "k002");
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
        // Enough rows for every bucket: every bound kept.
        assert_eq!(coarsen(bounds(101), 1_000_000.0, 1), bounds(101));
    }

    #[test]
    fn coarsen_gives_one_range_to_a_small_scope_or_no_statistics() {
        assert!(coarsen(bounds(101), 15_000.0, 10_000).is_empty());
        assert!(coarsen(bounds(101), 0.0, 10_000).is_empty());
        assert!(coarsen(Vec::new(), 1_000_000.0, 10_000).is_empty());
        assert_eq!(coarsen(bounds(101), 20_000.0, 10_000), vec!["k050".to_string()]);
    }
}
