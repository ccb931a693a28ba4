//! What a work table must have, checked against the catalog when a job
//! starts, so a missing column or index is one clear error at start instead
//! of a failed statement (or a full scan per claim) at 05:00.

use sqlx::PgConnection;

use super::WorkQueue;
use crate::common::error::EngineError;
use crate::common::ident::{IndexRow, COLUMNS_SQL, INDEXES_SQL};

/// Columns a work table must have besides its scope and key columns.
pub const REQUIRED_COLUMNS: &[(&str, &str)] = &[
    ("status", "text: one of eligible, processing, settled, failed, held"),
    (
        "attempt",
        "integer NOT NULL DEFAULT 0: the fence, raised by every claim",
    ),
    (
        "attempt_base",
        "integer NOT NULL DEFAULT 0: attempts before the last operator retry (not counted toward the limit)",
    ),
    (
        "fence_epoch",
        "integer NOT NULL DEFAULT 0: the timeline of the primary that granted the lease (with attempt, the fence)",
    ),
    ("lease_owner", "uuid: the worker holding a lease"),
    ("lease_until", "timestamptz: when the lease expires (database clock)"),
    ("not_before", "timestamptz: do not claim before (retry backoff)"),
    ("last_error", "text: why the last attempt failed"),
    ("updated_at", "timestamptz: last change"),
];

/// Indexes a work table needs: a unique index on (scope, key), two
/// partial indexes so claims and progress counts read only what is left,
/// and one on the key of held items, so releasing a key's holds in every
/// scope (`Job::release_held`) reads those items only, not every scope.
pub const REQUIRED_INDEXES: &[&str] = &[
    "UNIQUE (scope, key), e.g. the primary key",
    "(scope, key) WHERE status = 'eligible'",
    "(scope, lease_until) WHERE status = 'processing'",
    "(key) WHERE status = 'held'",
];

/// The engine's bookkeeping columns, as a work table created by
/// [`WorkQueue::table_sql`] declares them (the ones [`REQUIRED_COLUMNS`]
/// describes, with their defaults).
const BOOKKEEPING_COLUMNS_SQL: &str = "status       text        NOT NULL DEFAULT 'eligible'
                 CHECK (status IN ('eligible', 'processing', 'settled', 'failed', 'held')),
    attempt      integer     NOT NULL DEFAULT 0,
    attempt_base integer     NOT NULL DEFAULT 0,
    fence_epoch  integer     NOT NULL DEFAULT 0,
    lease_owner  uuid,
    lease_until  timestamptz,
    not_before   timestamptz,
    last_error   text,
    updated_at   timestamptz NOT NULL DEFAULT now()";

impl WorkQueue {
    /// The statements that create this work table with the application's
    /// own `columns` (SQL column definitions, e.g. `"amount numeric NOT
    /// NULL"`; empty for none): the scope and key, the columns, the
    /// engine's bookkeeping columns and every index of
    /// [`REQUIRED_INDEXES`]. The application runs them (in its own
    /// migration, or at install); [`WorkQueue::check_table`] accepts what
    /// they create.
    pub fn table_sql(&self, columns: &str) -> String {
        let spec = &self.spec;
        let (table, scope, key) = (&spec.table, &spec.scope_column, &spec.key_column);
        let base = table.rsplit('.').next().unwrap_or(table);
        let columns = if columns.trim().is_empty() {
            String::new()
        } else {
            format!("{},\n    ", columns.trim().trim_end_matches(','))
        };
        format!(
            "CREATE TABLE {table} (
    {scope} {scope_type} NOT NULL,
    {key} {key_type} NOT NULL,
    {columns}{BOOKKEEPING_COLUMNS_SQL},
    PRIMARY KEY ({scope}, {key})
);
CREATE INDEX {base}_eligible ON {table} ({scope}, {key}) WHERE status = 'eligible';
CREATE INDEX {base}_processing ON {table} ({scope}, lease_until) WHERE status = 'processing';
CREATE INDEX {base}_held ON {table} ({key}) WHERE status = 'held';",
            scope_type = spec.scope_type,
            key_type = spec.key_type,
        )
    }
}

impl WorkQueue {
    /// Checks the work table against [`REQUIRED_COLUMNS`] and
    /// [`REQUIRED_INDEXES`]; the error names everything missing.
    pub async fn check_table(&self, conn: &mut PgConnection) -> Result<(), EngineError> {
        let table = &self.spec.table;
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&mut *conn)
            .await
            .map_err(EngineError::db("looking up the work table"))?;
        if !exists {
            return Err(EngineError::WorkTable {
                table: table.clone(),
                missing: vec!["the table itself (no such table)".into()],
            });
        }
        let columns: Vec<String> = sqlx::query_scalar(COLUMNS_SQL)
            .bind(table)
            .fetch_all(&mut *conn)
            .await
            .map_err(EngineError::db("reading the work table's columns"))?;
        let indexes: Vec<IndexRow> = sqlx::query_as(INDEXES_SQL)
            .bind(table)
            .fetch_all(&mut *conn)
            .await
            .map_err(EngineError::db("reading the work table's indexes"))?;
        let missing = self.missing(&columns, &indexes);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(EngineError::WorkTable {
                table: table.clone(),
                missing,
            })
        }
    }

    fn missing(&self, columns: &[String], indexes: &[IndexRow]) -> Vec<String> {
        let (scope, key) = (&self.spec.scope_column, &self.spec.key_column);
        let mut missing: Vec<String> = [scope.as_str(), key.as_str()]
            .into_iter()
            .chain(REQUIRED_COLUMNS.iter().map(|(name, _)| *name))
            .filter(|name| !columns.iter().any(|c| c == name))
            .map(|name| match REQUIRED_COLUMNS.iter().find(|(n, _)| *n == name) {
                Some((_, what)) => format!("column {name} ({what})"),
                None => format!("column {name}"),
            })
            .collect();
        let leads_with = |i: &IndexRow, first: &str, second: &str| {
            i.columns.first().map(String::as_str) == Some(first) && i.columns.get(1).map(String::as_str) == Some(second)
        };
        let partial_on = |i: &IndexRow, status: &str| {
            i.predicate
                .as_deref()
                .is_some_and(|p| p.replace(' ', "").contains(&format!("status='{status}'")))
        };
        if !indexes
            .iter()
            .any(|i| i.unique && i.predicate.is_none() && i.columns == [scope.clone(), key.clone()])
        {
            missing.push(format!("a unique index on ({scope}, {key})"));
        }
        if !indexes
            .iter()
            .any(|i| leads_with(i, scope, key) && partial_on(i, "eligible"))
        {
            missing.push(format!("an index on ({scope}, {key}) WHERE status = 'eligible'"));
        }
        if !indexes
            .iter()
            .any(|i| leads_with(i, scope, "lease_until") && partial_on(i, "processing"))
        {
            missing.push(format!(
                "an index on ({scope}, lease_until) WHERE status = 'processing'"
            ));
        }
        if !indexes
            .iter()
            .any(|i| i.columns.first() == Some(key) && partial_on(i, "held"))
        {
            missing.push(format!("an index on ({key}) WHERE status = 'held'"));
        }
        missing
    }
}
