//! A work table and the SQL that claims, completes and counts its items.
//!
//! Every statement is rendered once, when the [`WorkQueue`] is built, from
//! identifiers that [`QueueSpec`] has validated; values are always bound
//! parameters. This module is the one place the engine's SQL lives.

use sqlx::{PgConnection, Row};

use crate::{EngineError, ItemStatus};

/// Indexes a work table needs (besides its primary key on (scope, key)):
/// claims and progress counts read only what is still to do.
pub const REQUIRED_INDEXES: &[&str] = &[
    "(scope, key) WHERE status = 'eligible'",
    "(scope, lease_until) WHERE status = 'processing'",
];

/// Columns a work table must have besides its scope and key columns.
pub const REQUIRED_COLUMNS: &[(&str, &str)] = &[
    (
        "status",
        "text: one of eligible, processing, settled, failed, held",
    ),
    (
        "attempt",
        "integer NOT NULL DEFAULT 0: the fence, raised by every claim",
    ),
    ("lease_owner", "uuid: the worker holding a lease"),
    (
        "lease_until",
        "timestamptz: when the lease expires (database clock)",
    ),
    (
        "not_before",
        "timestamptz: do not claim before (retry backoff)",
    ),
    ("last_error", "text: why the last attempt failed"),
    ("updated_at", "timestamptz: last change"),
];

/// Largest chunk one claim may take.
pub const MAX_CHUNK_ITEMS: u32 = 10_000;

/// Describes a work table. All fields are SQL identifiers (or type names),
/// validated by [`WorkQueue::new`].
#[derive(Debug, Clone)]
pub struct QueueSpec {
    /// The job's name, as stored in `settled_engine.runs.job`.
    pub job: String,
    /// The work table, `schema.table` or `table`.
    pub table: String,
    /// The column that one run covers (e.g. `period`).
    pub scope_column: String,
    /// Its SQL type (e.g. `date`).
    pub scope_type: String,
    /// The column that identifies an item within a scope (e.g. `creator`).
    pub key_column: String,
    /// Its SQL type (e.g. `text`).
    pub key_type: String,
}

/// A validated work table with its rendered statements.
#[derive(Debug, Clone)]
pub struct WorkQueue {
    spec: QueueSpec,
    sql: QueueSql,
}

#[derive(Debug, Clone)]
struct QueueSql {
    claim_in_tx: String,
    mark_settled_in_tx: String,
    count_unfinished: String,
    count_by_status: String,
    analyze: String,
    stale_statistics: String,
}

fn check_identifier(
    field: &'static str,
    value: &str,
    allow_schema: bool,
) -> Result<(), EngineError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let parts: Vec<&str> = value.split('.').collect();
    let ok = match parts.as_slice() {
        [one] => part_ok(one),
        [schema, name] if allow_schema => part_ok(schema) && part_ok(name),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(EngineError::InvalidIdentifier {
            field,
            value: value.to_string(),
        })
    }
}

impl WorkQueue {
    /// Validates the spec and renders the queue's statements.
    pub fn new(spec: QueueSpec) -> Result<WorkQueue, EngineError> {
        check_identifier("table", &spec.table, true)?;
        check_identifier("scope_column", &spec.scope_column, false)?;
        check_identifier("scope_type", &spec.scope_type, false)?;
        check_identifier("key_column", &spec.key_column, false)?;
        check_identifier("key_type", &spec.key_type, false)?;
        if spec.job.is_empty() || spec.job.len() > 100 {
            return Err(EngineError::InvalidIdentifier {
                field: "job",
                value: spec.job.clone(),
            });
        }
        let QueueSpec {
            table,
            scope_column: scope,
            scope_type,
            key_column: key,
            key_type,
            ..
        } = &spec;

        // Claim for in-transaction mode: the row locks are the claim, held
        // until commit; the status is re-checked when the items are marked.
        // Locking rows straight from the SELECT (no `key IN (subquery)`)
        // locks exactly the rows returned, never more.
        let claim_in_tx = format!(
            "SELECT t.{key}::text AS key, t.attempt + 1 AS fence
             FROM {table} t
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.status = 'eligible'
               AND (t.not_before IS NULL OR t.not_before <= now())
               AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running')
             LIMIT $2
             FOR NO KEY UPDATE OF t SKIP LOCKED"
        );
        let mark_settled_in_tx = format!(
            "UPDATE {table}
             SET status = 'settled', attempt = attempt + 1, lease_owner = NULL,
                 lease_until = NULL, last_error = NULL, updated_at = now()
             WHERE {scope} = CAST($1 AS {scope_type})
               AND {key} = ANY(CAST($2 AS {key_type}[]))
               AND status = 'eligible'"
        );
        // Two counts, each answered from its partial index (eligible,
        // processing), so polling progress stays cheap on a large scope.
        let count_unfinished = format!(
            "SELECT (SELECT count(*) FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'eligible')
                  + (SELECT count(*) FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'processing')"
        );
        let count_by_status = format!(
            "SELECT status, count(*) FROM {table}
             WHERE {scope} = CAST($1 AS {scope_type}) GROUP BY status"
        );
        let analyze = format!("ANALYZE {table}");
        let stale_statistics = "SELECT coalesce(n_mod_since_analyze > greatest(1000, n_live_tup / 10), true)
             FROM pg_stat_user_tables WHERE relid = to_regclass($1)"
            .to_string();
        Ok(WorkQueue {
            sql: QueueSql {
                claim_in_tx,
                mark_settled_in_tx,
                count_unfinished,
                count_by_status,
                analyze,
                stale_statistics,
            },
            spec,
        })
    }

    /// The spec this queue was built from.
    pub fn spec(&self) -> &QueueSpec {
        &self.spec
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.spec.job
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
    ) -> Result<Vec<(String, i32)>, EngineError> {
        debug_assert!(limit >= 1 && limit <= MAX_CHUNK_ITEMS);
        let rows = sqlx::query(&self.sql.claim_in_tx)
            .bind(scope)
            .bind(i64::from(limit))
            .bind(run_id)
            .fetch_all(tx)
            .await
            .map_err(EngineError::db("claiming a chunk"))?;
        rows.iter()
            .map(|r| Ok((r.try_get("key")?, r.try_get("fence")?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(EngineError::db("reading a claimed chunk"))
    }

    /// Marks claimed items `settled` in the claiming transaction. Fails (and
    /// the caller must roll back) unless every item is still `eligible`.
    pub async fn mark_settled_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        keys: &[String],
    ) -> Result<(), EngineError> {
        let done = sqlx::query(&self.sql.mark_settled_in_tx)
            .bind(scope)
            .bind(keys)
            .execute(tx)
            .await
            .map_err(EngineError::db("marking a chunk settled"))?
            .rows_affected();
        if done != keys.len() as u64 {
            return Err(EngineError::Invariant(format!(
                "marked {done} of {} claimed items settled; rolling the chunk back",
                keys.len()
            )));
        }
        Ok(())
    }

    /// Refreshes the planner's statistics of the work table. A scope loaded
    /// just before its run (and not yet seen by autovacuum) otherwise looks
    /// empty to the planner, which then scans the whole scope per statement
    /// instead of looking items up by key. Needs ownership of the table.
    /// Skipped (returning false) while the statistics are fresh: fewer than
    /// 10% of the rows changed since the last analyze.
    pub async fn refresh_statistics(&self, conn: &mut PgConnection) -> Result<bool, EngineError> {
        let stale: Option<bool> = sqlx::query_scalar(&self.sql.stale_statistics)
            .bind(&self.spec.table)
            .fetch_optional(&mut *conn)
            .await
            .map_err(EngineError::db("reading the work table's statistics"))?;
        if stale == Some(false) {
            return Ok(false);
        }
        sqlx::query(&self.sql.analyze)
            .execute(conn)
            .await
            .map_err(EngineError::db("analyzing the work table"))?;
        Ok(true)
    }

    /// Exact count of items of `scope` still to do (eligible or processing),
    /// from committed state: never SKIP LOCKED, which would hide rows.
    pub async fn count_unfinished(
        &self,
        conn: &mut PgConnection,
        scope: &str,
    ) -> Result<i64, EngineError> {
        sqlx::query_scalar(&self.sql.count_unfinished)
            .bind(scope)
            .fetch_one(conn)
            .await
            .map_err(EngineError::db("counting unfinished items"))
    }

    /// Exact counts by status for `scope` (every status present, zero if none).
    pub async fn count_by_status(
        &self,
        conn: &mut PgConnection,
        scope: &str,
    ) -> Result<Vec<(ItemStatus, i64)>, EngineError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&self.sql.count_by_status)
            .bind(scope)
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("counting items by status"))?;
        let mut counts: Vec<(ItemStatus, i64)> = ItemStatus::ALL.iter().map(|s| (*s, 0)).collect();
        for (status, n) in rows {
            let parsed = ItemStatus::parse(&status)
                .ok_or_else(|| EngineError::Invariant(format!("unknown item status {status:?}")))?;
            if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == parsed) {
                slot.1 = n;
            }
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> QueueSpec {
        QueueSpec {
            job: "j".into(),
            table: "s.t".into(),
            scope_column: "period".into(),
            scope_type: "date".into(),
            key_column: "k".into(),
            key_type: "text".into(),
        }
    }

    #[test]
    fn rejects_identifiers_that_are_not_plain_names() {
        for bad in ["t; drop table x", "T", "a.b.c", "", "1t", "t\"", "a b"] {
            let mut s = spec();
            s.table = bad.into();
            assert!(WorkQueue::new(s).is_err(), "{bad:?} accepted");
        }
        let mut s = spec();
        s.key_type = "text[]".into();
        assert!(WorkQueue::new(s).is_err());
        assert!(WorkQueue::new(spec()).is_ok());
    }
}
