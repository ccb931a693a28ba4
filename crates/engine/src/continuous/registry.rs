//! The registry of continuous queues (`settled_engine.queues`) as tools read
//! it: every queue's name, table and pause, with its table's key column as
//! the catalog has it, so a tool can build the [`Queue`] without knowing the
//! application. Reads the catalog by name, never through `to_regclass`: a
//! table the reader may not see makes its own error later, not the listing's.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::Queue;
use crate::common::error::EngineError;

/// A registered queue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct RegisteredQueue {
    /// The queue's name.
    pub name: String,
    /// Its work table, as registered.
    pub table: String,
    /// Since when it is paused (None: its jobs are served).
    pub paused_at: Option<DateTime<Utc>>,
    /// The table's key column (its single-column primary key, else a
    /// single-column unique index); None when no such table is found.
    pub key_column: Option<String>,
    /// That column's type as PostgreSQL names it (`text`, `bigint`, ...).
    pub key_type: Option<String>,
}

impl RegisteredQueue {
    /// True while paused.
    pub fn paused(&self) -> bool {
        self.paused_at.is_some()
    }

    /// The queue on its table and key (`key text` when the table was not
    /// found); an error when a name is not a plain SQL identifier.
    pub fn queue(&self) -> Result<Queue, EngineError> {
        Queue::with_key(
            &self.name,
            &self.table,
            self.key_column.as_deref().unwrap_or("key"),
            self.key_type.as_deref().unwrap_or("text"),
        )
    }
}

/// Every registered queue, by name.
pub async fn registered_queues(conn: &mut PgConnection) -> Result<Vec<RegisteredQueue>, EngineError> {
    sqlx::query_as(
        "SELECT q.name, q.table_name AS table, q.paused_at, k.key_column, k.key_type
         FROM settled_engine.queues q
         LEFT JOIN LATERAL (
             SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind IN ('r', 'p')
               AND CASE WHEN strpos(q.table_name, '.') > 0
                        THEN n.nspname = split_part(q.table_name, '.', 1)
                             AND c.relname = split_part(q.table_name, '.', 2)
                        ELSE c.relname = q.table_name AND pg_table_is_visible(c.oid) END
             LIMIT 1) rel ON true
         LEFT JOIN LATERAL (
             SELECT a.attname::text AS key_column, format_type(a.atttypid, NULL) AS key_type
             FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
             WHERE i.indrelid = rel.oid AND i.indisunique AND i.indpred IS NULL AND i.indnkeyatts = 1
             ORDER BY i.indisprimary DESC, i.indexrelid
             LIMIT 1) k ON true
         ORDER BY q.name",
    )
    .fetch_all(conn)
    .await
    .map_err(EngineError::db("reading the queue registry"))
}
