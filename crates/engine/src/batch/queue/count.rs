//! Counting: exact counts from committed state, never through SKIP LOCKED
//! (which hides the rows others hold). This is the one place item statuses
//! are counted; reports, progress and the finisher all read it.

use sqlx::PgConnection;

use super::{Names, WorkQueue};
use crate::common::error::EngineError;
use crate::common::status::ItemStatus;

#[derive(Debug, Clone)]
pub(super) struct Sql {
    unfinished: String,
    any_unfinished: String,
    by_status: String,
    all_by_status: String,
    has_items: String,
    scope_relation: String,
}

/// Exact counts of a scope's items, one per status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct StatusCounts {
    /// (status, items), every status present, in [`ItemStatus::ALL`] order.
    pub counts: Vec<(ItemStatus, i64)>,
}

impl StatusCounts {
    /// Items with this status.
    pub fn get(&self, status: ItemStatus) -> i64 {
        self.counts.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n)
    }

    /// All items of the scope.
    pub fn total(&self) -> i64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }

    /// Items still to do (eligible or processing).
    pub fn unfinished(&self) -> i64 {
        self.get(ItemStatus::Eligible) + self.get(ItemStatus::Processing)
    }

    /// The counts as a JSON object keyed by status.
    pub fn to_json(&self) -> serde_json::Value {
        self.counts
            .iter()
            .map(|(s, n)| (s.as_str().to_string(), serde_json::Value::from(*n)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

#[derive(sqlx::FromRow)]
struct StatusRow {
    status: String,
    items: i64,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type, key) = (n.table, n.scope, n.scope_type, n.key);
        Sql {
            // Two counts, each answered from its partial index (eligible,
            // processing), so polling progress stays cheap on a large scope.
            unfinished: format!(
                "SELECT (SELECT count(*) FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'eligible')
                      + (SELECT count(*) FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'processing')"
            ),
            // Is anything left? The first entry of each partial index, in
            // its own order: the planner then walks the index (past the
            // entries settled rows left, which claims mark dead as they
            // pass) instead of trusting statistics taken before the run,
            // which say every row is eligible and choose a scan of the whole
            // scope (at a million: 40 ms against 150 to 400 ms for the
            // counts, at every loop's end). ORDER BY and LIMIT stay outside
            // EXISTS, which would drop them.
            any_unfinished: format!(
                "SELECT (SELECT 1 FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'eligible'
                         ORDER BY {key} LIMIT 1) IS NOT NULL
                     OR (SELECT 1 FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'processing'
                         ORDER BY lease_until LIMIT 1) IS NOT NULL"
            ),
            by_status: format!(
                "SELECT status, count(*) AS items FROM {table}
                 WHERE {scope} = CAST($1 AS {scope_type}) GROUP BY status"
            ),
            all_by_status: format!("SELECT status, count(*) AS items FROM {table} GROUP BY status"),
            has_items: format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE {scope} = CAST($1 AS {scope_type}))"),
            // The relation holding the scope's rows: the table itself, or
            // the partition of a table partitioned by scope.
            scope_relation: format!(
                "SELECT tableoid::regclass::text FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) LIMIT 1"
            ),
        }
    }
}

/// True when the planner's statistics of `table` miss more than 10% of its
/// rows (or it was never analyzed).
const STALE_STATISTICS_SQL: &str = "SELECT coalesce(n_mod_since_analyze > greatest(1000, n_live_tup / 10)
                         OR (last_analyze IS NULL AND last_autoanalyze IS NULL), true)
     FROM pg_stat_user_tables WHERE relid = to_regclass($1)";

impl WorkQueue {
    /// Exact count of items of `scope` still to do (eligible or processing),
    /// from committed state: never SKIP LOCKED, which would hide rows.
    pub async fn count_unfinished(&self, conn: &mut PgConnection, scope: &str) -> Result<i64, EngineError> {
        sqlx::query_scalar(&self.sql.count.unfinished)
            .bind(self.scope_arg(scope)?) // $1
            .fetch_one(conn)
            .await
            .map_err(EngineError::db("counting unfinished items"))
    }

    /// True when `scope` has an item still to do (eligible or processing),
    /// from committed state: the engine's "is anything left?" (after an
    /// empty claim, before a finish). Cheaper than [`Self::count_unfinished`]
    /// on a scope just settled.
    pub async fn has_unfinished(&self, conn: &mut PgConnection, scope: &str) -> Result<bool, EngineError> {
        sqlx::query_scalar(&self.sql.count.any_unfinished)
            .bind(self.scope_arg(scope)?) // $1
            .fetch_one(conn)
            .await
            .map_err(EngineError::db("looking for unfinished items"))
    }

    /// Exact counts by status for `scope` (every status present, zero if none).
    pub async fn count_by_status(&self, conn: &mut PgConnection, scope: &str) -> Result<StatusCounts, EngineError> {
        let rows: Vec<StatusRow> = sqlx::query_as(&self.sql.count.by_status)
            .bind(self.scope_arg(scope)?) // $1
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("counting items by status"))?;
        StatusCounts::from_rows(rows)
    }

    /// Exact counts by status over every scope of the table.
    pub async fn count_all_by_status(&self, conn: &mut PgConnection) -> Result<StatusCounts, EngineError> {
        let rows: Vec<StatusRow> = sqlx::query_as(&self.sql.count.all_by_status)
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("counting items by status"))?;
        StatusCounts::from_rows(rows)
    }
}

impl StatusCounts {
    fn from_rows(rows: Vec<StatusRow>) -> Result<StatusCounts, EngineError> {
        let mut counts: Vec<(ItemStatus, i64)> = ItemStatus::ALL.iter().map(|s| (*s, 0)).collect();
        for row in rows {
            let parsed = ItemStatus::parse(&row.status)
                .ok_or_else(|| EngineError::Invariant(format!("unknown item status {:?}", row.status)))?;
            if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == parsed) {
                slot.1 = row.items;
            }
        }
        Ok(StatusCounts { counts })
    }
}

impl WorkQueue {
    /// True when `scope` has at least one item.
    pub async fn has_items(&self, conn: &mut PgConnection, scope: &str) -> Result<bool, EngineError> {
        sqlx::query_scalar(&self.sql.count.has_items)
            .bind(self.scope_arg(scope)?) // $1
            .fetch_one(conn)
            .await
            .map_err(EngineError::db("looking for a scope's items"))
    }

    /// Refreshes the planner's statistics of the relation holding `scope`'s
    /// items: the work table, or its partition when the table is
    /// partitioned by scope (so one period's load never re-samples every
    /// other period). A scope loaded just before its run (and not yet seen
    /// by autovacuum) otherwise looks empty to the planner, which then scans
    /// the whole scope per statement instead of looking items up by key.
    /// Needs ownership of the table. Skipped (returning false) while the
    /// statistics are fresh (fewer than 10% of the rows changed since the
    /// last analyze) or the scope has no items.
    pub async fn refresh_statistics(&self, conn: &mut PgConnection, scope: &str) -> Result<bool, EngineError> {
        let relation: Option<String> = sqlx::query_scalar(&self.sql.count.scope_relation)
            .bind(self.scope_arg(scope)?) // $1
            .fetch_optional(&mut *conn)
            .await
            .map_err(EngineError::db("finding the relation of a scope's items"))?;
        let Some(relation) = relation else {
            return Ok(false);
        };
        let stale: Option<bool> = sqlx::query_scalar(STALE_STATISTICS_SQL)
            .bind(&relation) // $1
            .fetch_optional(&mut *conn)
            .await
            .map_err(EngineError::db("reading the work table's statistics"))?;
        if stale == Some(false) {
            return Ok(false);
        }
        // `relation` is regclass output: a name PostgreSQL quoted itself.
        sqlx::query(&format!("ANALYZE {relation}"))
            .execute(conn)
            .await
            .map_err(EngineError::db("analyzing the work table"))?;
        Ok(true)
    }
}
