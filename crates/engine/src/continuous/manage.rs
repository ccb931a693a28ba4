//! Operators' verbs, each one conditional update whose row count is the
//! answer: pause and resume a queue, cancel a job that has not started,
//! replay dead letters one at a time or by filter.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::{Names, Queue, MAX_BATCH_JOBS, WAKE_CHANNEL};
use crate::common::error::EngineError;

#[derive(Debug, Clone)]
pub(super) struct Sql {
    cancel: String,
    replay: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, key, key_type) = (n.table, n.key, n.key_type);
        Sql {
            // Only a job nobody holds: an in-transaction claim's row lock
            // means it has started (SKIP LOCKED leaves it alone).
            cancel: format!(
                "WITH free AS MATERIALIZED (
                     SELECT t.{key} AS key FROM {table} t
                     WHERE t.{key} = CAST($1 AS {key_type}) AND t.status = 'eligible'
                     FOR NO KEY UPDATE OF t SKIP LOCKED)
                 UPDATE {table} t
                 SET status = 'cancelled', updated_at = now()
                 FROM free
                 WHERE t.{key} = free.key AND t.status = 'eligible'"
            ),
            // A replayed job starts a fresh count of attempts; its attempt
            // (the fence) keeps rising, and its history is kept.
            replay: format!(
                "WITH picked AS MATERIALIZED (
                     SELECT t.{key} AS key FROM {table} t
                     WHERE t.status = 'failed'
                       AND ($1::text IS NULL OR t.{key}::text = $1)
                       AND ($2::text IS NULL OR strpos(coalesce(t.last_error, ''), $2) > 0)
                       AND ($3::timestamptz IS NULL OR t.updated_at >= $3)
                       AND ($4::timestamptz IS NULL OR t.updated_at < $4)
                     ORDER BY t.updated_at
                     LIMIT $5
                     FOR NO KEY UPDATE OF t SKIP LOCKED)
                 UPDATE {table} t
                 SET status = 'eligible', attempt_base = t.attempt, not_before = now(), updated_at = now()
                 FROM picked
                 WHERE t.{key} = picked.key AND t.status = 'failed'"
            ),
        }
    }
}

/// Which dead letters (`failed` jobs) to replay; every field that is set
/// must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    /// This job only.
    pub key: Option<String>,
    /// Jobs whose last error contains this text.
    pub error_contains: Option<String>,
    /// Jobs that failed at or after this time.
    pub failed_since: Option<DateTime<Utc>>,
    /// Jobs that failed before this time.
    pub failed_before: Option<DateTime<Utc>>,
    /// At most this many (1..=[`MAX_BATCH_JOBS`], oldest failure first).
    pub limit: u32,
}

impl ReplayFilter {
    /// One job by key.
    pub fn key(key: impl Into<String>) -> ReplayFilter {
        ReplayFilter {
            key: Some(key.into()),
            limit: 1,
            ..ReplayFilter::default()
        }
    }
}

impl Queue {
    /// Pauses the queue: no claim takes a job until [`Queue::resume`].
    /// True when it was running. Jobs already claimed finish.
    pub async fn pause(&self, conn: &mut PgConnection) -> Result<bool, EngineError> {
        let changed = sqlx::query(
            "UPDATE settled_engine.queues SET paused_at = now(), updated_at = now()
             WHERE name = $1 AND paused_at IS NULL",
        )
        .bind(&self.name) // $1
        .execute(conn)
        .await
        .map_err(EngineError::db("pausing a queue"))?
        .rows_affected();
        Ok(changed == 1)
    }

    /// Resumes a paused queue and wakes its workers. True when it was paused.
    pub async fn resume(&self, conn: &mut PgConnection) -> Result<bool, EngineError> {
        let changed = sqlx::query(
            "UPDATE settled_engine.queues SET paused_at = NULL, updated_at = now()
             WHERE name = $1 AND paused_at IS NOT NULL",
        )
        .bind(&self.name) // $1
        .execute(&mut *conn)
        .await
        .map_err(EngineError::db("resuming a queue"))?
        .rows_affected();
        if changed == 1 {
            self.wake(conn).await?;
        }
        Ok(changed == 1)
    }

    /// True while the queue is paused.
    pub async fn is_paused(&self, conn: &mut PgConnection) -> Result<bool, EngineError> {
        let paused: Option<bool> =
            sqlx::query_scalar("SELECT paused_at IS NOT NULL FROM settled_engine.queues WHERE name = $1")
                .bind(&self.name) // $1
                .fetch_optional(conn)
                .await
                .map_err(EngineError::db("reading a queue's pause"))?;
        Ok(paused.unwrap_or(false))
    }

    /// Cancels a job that has not started (eligible and not held by a
    /// transaction). True when it did.
    pub async fn cancel(&self, conn: &mut PgConnection, key: &str) -> Result<bool, EngineError> {
        let changed = sqlx::query(&self.sql.manage.cancel)
            .bind(key) // $1
            .execute(conn)
            .await
            .map_err(EngineError::db("cancelling a job"))?
            .rows_affected();
        Ok(changed == 1)
    }

    /// Makes the dead letters `filter` selects eligible again, with a fresh
    /// count of attempts, and wakes the workers. Returns how many.
    pub async fn replay(&self, conn: &mut PgConnection, filter: &ReplayFilter) -> Result<u64, EngineError> {
        if !(1..=MAX_BATCH_JOBS).contains(&filter.limit) {
            return Err(EngineError::Config(format!(
                "a replay takes 1..={MAX_BATCH_JOBS} jobs, got {}",
                filter.limit
            )));
        }
        let replayed = sqlx::query(&self.sql.manage.replay)
            .bind(&filter.key) // $1
            .bind(&filter.error_contains) // $2
            .bind(filter.failed_since) // $3
            .bind(filter.failed_before) // $4
            .bind(i64::from(filter.limit)) // $5
            .execute(&mut *conn)
            .await
            .map_err(EngineError::db("replaying failed jobs"))?
            .rows_affected();
        if replayed > 0 {
            self.wake(conn).await?;
        }
        Ok(replayed)
    }

    /// Notifies the queue's workers (delivered when the caller's
    /// transaction commits).
    pub async fn wake(&self, conn: &mut PgConnection) -> Result<(), EngineError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WAKE_CHANNEL) // $1
            .bind(&self.name) // $2
            .execute(conn)
            .await
            .map_err(EngineError::db("waking a queue's workers"))?;
        Ok(())
    }
}
