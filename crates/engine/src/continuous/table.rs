//! A conforming table for a continuous queue: the DDL that creates one (so
//! nobody hand-writes its columns, indexes and trigger), and the check every
//! worker runs at start, which names whatever is missing.

use sqlx::PgConnection;

use super::Queue;
use crate::common::error::EngineError;
use crate::common::ident::{IndexRow, COLUMNS_SQL, INDEXES_SQL};

/// Columns a continuous queue's table must have besides its key column.
pub const CONTINUOUS_COLUMNS: &[(&str, &str)] = &[
    ("payload", "jsonb NOT NULL DEFAULT '{}': what the handler gets"),
    ("priority", "smallint NOT NULL DEFAULT 0: lower runs first"),
    ("seq", "bigint GENERATED ALWAYS AS IDENTITY: enqueue order"),
    ("enqueued_at", "timestamptz NOT NULL DEFAULT now()"),
    ("not_before", "timestamptz NOT NULL DEFAULT now(): do not claim before"),
    (
        "status",
        "text NOT NULL DEFAULT 'eligible': eligible, processing, settled, failed or cancelled",
    ),
    (
        "attempt",
        "integer NOT NULL DEFAULT 0: the fence, raised by every claim",
    ),
    (
        "attempt_base",
        "integer NOT NULL DEFAULT 0: attempts not counted toward the limit (replays, snoozes)",
    ),
    (
        "fence_epoch",
        "integer NOT NULL DEFAULT 0: the timeline of the primary that granted the lease",
    ),
    ("lease_owner", "uuid: the worker holding a lease"),
    ("lease_until", "timestamptz: when the lease expires (database clock)"),
    ("last_error", "text: why the last attempt failed"),
    ("errors", "jsonb NOT NULL DEFAULT '[]': the attempt history"),
    ("traceparent", "text: the W3C trace context of the enqueuing request"),
    ("updated_at", "timestamptz NOT NULL DEFAULT now(): last change"),
];

/// Indexes a continuous queue's table needs: claims read the head of the
/// eligible index in run order, the rescuer reads expired leases, retention
/// and dead-letter listings read finished jobs by age.
pub const CONTINUOUS_INDEXES: &[&str] = &[
    "PRIMARY KEY or UNIQUE (key)",
    "(priority, not_before, seq) WHERE status = 'eligible'",
    "(lease_until) WHERE status = 'processing'",
    "(updated_at) WHERE status IN ('settled', 'failed', 'cancelled')",
];

impl Queue {
    /// The SQL that creates this queue's table, its indexes and wake-up
    /// trigger, and registers the queue, as a call of the engine's
    /// `settled_engine.create_queue` (put it in a migration after the
    /// engine's, or run it with [`Queue::create_table`]). Add the
    /// application's own columns after it (with defaults, so a plain
    /// enqueue still works).
    pub fn table_sql(&self) -> String {
        // The names are identifiers `Queue::new` checked (lowercase,
        // digits, `_`): nothing in them needs quoting.
        format!(
            "SELECT settled_engine.create_queue('{}', '{}', '{}', '{}');",
            self.name, self.table, self.key, self.key_type
        )
    }

    /// Creates the table, indexes and trigger (`settled_engine.create_queue`,
    /// the one home of a continuous queue's table) and registers the queue,
    /// in one transaction of the caller's.
    pub async fn create_table(&self, conn: &mut PgConnection) -> Result<(), EngineError> {
        sqlx::query("SELECT settled_engine.create_queue($1, $2, $3, $4)")
            .bind(&self.name) // $1
            .bind(&self.table) // $2
            .bind(&self.key) // $3
            .bind(&self.key_type) // $4
            .execute(conn)
            .await
            .map_err(EngineError::db("creating a queue's table"))?;
        Ok(())
    }

    /// Registers the queue (if it is not) and checks its table against
    /// [`CONTINUOUS_COLUMNS`] and [`CONTINUOUS_INDEXES`] and for the
    /// wake-up trigger; the error names everything missing. Every worker
    /// calls it at start.
    pub async fn declare(&self, conn: &mut PgConnection) -> Result<(), EngineError> {
        self.check_table(conn).await?;
        let registered: Option<String> =
            sqlx::query_scalar("SELECT table_name FROM settled_engine.queues WHERE name = $1")
                .bind(&self.name) // $1
                .fetch_optional(&mut *conn)
                .await
                .map_err(EngineError::db("reading the queue registry"))?;
        match registered {
            Some(table) if table == self.table => Ok(()),
            Some(table) => Err(EngineError::Config(format!(
                "queue {:?} is registered on table {table}, not {}",
                self.name, self.table
            ))),
            None => {
                sqlx::query(
                    "INSERT INTO settled_engine.queues (name, table_name) VALUES ($1, $2)
                     ON CONFLICT (name) DO NOTHING",
                )
                .bind(&self.name) // $1
                .bind(&self.table) // $2
                .execute(conn)
                .await
                .map_err(EngineError::db("registering a queue"))?;
                Ok(())
            }
        }
    }

    /// Checks the table; the error names each missing column, index and the trigger.
    pub async fn check_table(&self, conn: &mut PgConnection) -> Result<(), EngineError> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&self.table) // $1
            .fetch_one(&mut *conn)
            .await
            .map_err(EngineError::db("looking up the queue's table"))?;
        if !exists {
            return Err(self.lacks(vec!["the table itself (no such table)".into()]));
        }
        let columns: Vec<String> = sqlx::query_scalar(COLUMNS_SQL)
            .bind(&self.table) // $1
            .fetch_all(&mut *conn)
            .await
            .map_err(EngineError::db("reading the queue table's columns"))?;
        let indexes: Vec<IndexRow> = sqlx::query_as(INDEXES_SQL)
            .bind(&self.table) // $1
            .fetch_all(&mut *conn)
            .await
            .map_err(EngineError::db("reading the queue table's indexes"))?;
        let wakes: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
                            JOIN pg_namespace n ON n.oid = p.pronamespace
                            WHERE g.tgrelid = to_regclass($1) AND NOT g.tgisinternal
                              AND n.nspname = 'settled_engine' AND p.proname = 'queue_wake')",
        )
        .bind(&self.table) // $1
        .fetch_one(&mut *conn)
        .await
        .map_err(EngineError::db("reading the queue table's triggers"))?;
        let mut missing = self.missing(&columns, &indexes);
        if !wakes {
            missing.push(format!(
                "the wake-up trigger (AFTER INSERT FOR EACH STATEMENT EXECUTE FUNCTION settled_engine.queue_wake('{}'))",
                self.name
            ));
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(self.lacks(missing))
        }
    }

    fn lacks(&self, missing: Vec<String>) -> EngineError {
        EngineError::WorkTable {
            table: self.table.clone(),
            missing,
        }
    }

    fn missing(&self, columns: &[String], indexes: &[IndexRow]) -> Vec<String> {
        let key = &self.key;
        let mut missing: Vec<String> = std::iter::once((key.as_str(), "the key"))
            .chain(CONTINUOUS_COLUMNS.iter().copied())
            .filter(|(name, _)| !columns.iter().any(|c| c == name))
            .map(|(name, what)| format!("column {name} ({what})"))
            .collect();
        let status_in = |i: &IndexRow, statuses: &[&str]| {
            i.predicate.as_deref().is_some_and(|p| {
                let p = p.replace(' ', "");
                statuses.iter().all(|s| p.contains(&format!("'{s}'")))
            })
        };
        let on = |i: &IndexRow, cols: &[&str]| i.columns.iter().map(String::as_str).eq(cols.iter().copied());
        if !indexes
            .iter()
            .any(|i| i.unique && i.predicate.is_none() && i.columns == [key.clone()])
        {
            missing.push(format!("a unique index on ({key}), e.g. the primary key"));
        }
        let wanted: [(&[&str], &[&str], &str); 3] = [
            (&["priority", "not_before", "seq"], &["eligible"], CONTINUOUS_INDEXES[1]),
            (&["lease_until"], &["processing"], CONTINUOUS_INDEXES[2]),
            (
                &["updated_at"],
                &["settled", "failed", "cancelled"],
                CONTINUOUS_INDEXES[3],
            ),
        ];
        for (cols, statuses, what) in wanted {
            if !indexes.iter().any(|i| on(i, cols) && status_in(i, statuses)) {
                missing.push(format!("an index on {what}"));
            }
        }
        missing
    }
}
