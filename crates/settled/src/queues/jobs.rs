//! A continuous queue's jobs for the console: the jobs in one state, paged
//! by keyset in the order of the index that state has (ready and scheduled
//! in claim order, processing by lease expiry, failed newest first), and
//! one job with its attempts, errors and lease. The cursor is the last
//! job's key, looked up by the primary key; never OFFSET. Reads only.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::{sqlstate, unusable, Found, QueueError, BAD_KEY_STATES};
use settled_engine::EngineError;

/// Most jobs on a page.
pub(crate) const JOBS_PAGE_MAX: i64 = 500;

/// A state a job is listed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Eligible now.
    Ready,
    /// Eligible, not before a later time.
    Scheduled,
    /// Leased by a worker.
    Processing,
    /// Failed for good (a dead letter).
    Failed,
}

impl JobState {
    /// Every state, in the order the page shows them.
    pub(crate) const ALL: [JobState; 4] = [
        JobState::Ready,
        JobState::Scheduled,
        JobState::Processing,
        JobState::Failed,
    ];

    /// As the page and its links spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Scheduled => "scheduled",
            JobState::Processing => "processing",
            JobState::Failed => "failed",
        }
    }

    /// The state named `text`.
    pub(crate) fn parse(text: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The rows of this state, the order its index keeps, and the keyset
    /// condition after the cursor row `c` (all column names trusted).
    fn sql(self) -> (&'static str, &'static str, &'static str) {
        match self {
            JobState::Ready => (
                "t.status = 'eligible' AND t.not_before <= now()",
                "t.priority, t.not_before, t.seq",
                "(t.priority, t.not_before, t.seq) > (c.priority, c.not_before, c.seq)",
            ),
            JobState::Scheduled => (
                "t.status = 'eligible' AND t.not_before > now()",
                "t.priority, t.not_before, t.seq",
                "(t.priority, t.not_before, t.seq) > (c.priority, c.not_before, c.seq)",
            ),
            JobState::Processing => (
                "t.status = 'processing'",
                "t.lease_until, t.seq",
                "(t.lease_until, t.seq) > (c.lease_until, c.seq)",
            ),
            // The status test repeats the finished index's predicate so the
            // planner reads that index.
            JobState::Failed => (
                "t.status IN ('settled', 'failed', 'cancelled') AND t.status = 'failed'",
                "t.updated_at DESC, t.seq DESC",
                "(t.updated_at, t.seq) < (c.updated_at, c.seq)",
            ),
        }
    }
}

/// A job as listed.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct JobLine {
    /// Its key, as text.
    pub key: String,
    /// Attempts counted toward the limit.
    pub attempts: i32,
    /// Lower runs first.
    pub priority: i16,
    /// When it was enqueued.
    pub enqueued_at: DateTime<Utc>,
    /// Not claimed before.
    pub not_before: DateTime<Utc>,
    /// Who holds its lease.
    pub lease_owner: Option<uuid::Uuid>,
    /// Until when.
    pub lease_until: Option<DateTime<Utc>>,
    /// Why its last attempt failed.
    pub last_error: Option<String>,
    /// Its last change.
    pub updated_at: DateTime<Utc>,
}

const LINE_COLUMNS: &str = "t.{key}::text AS key, t.attempt - t.attempt_base AS attempts, t.priority, t.enqueued_at,
     t.not_before, t.lease_owner, t.lease_until, t.last_error, t.updated_at";

fn columns(found: &Found) -> String {
    LINE_COLUMNS.replace("{key}", &found.key_column)
}

/// The jobs of `found` in `state`, after the job keyed `after` (the last
/// of the page before), at most `limit` (capped at [`JOBS_PAGE_MAX`]).
pub(crate) async fn list(
    conn: &mut PgConnection,
    found: &Found,
    state: JobState,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<JobLine>, QueueError> {
    let (filter, order, keyset) = state.sql();
    let (table, key, key_type) = (found.queue.table(), &found.key_column, &found.key_type);
    let sql = format!(
        "SELECT {columns} FROM {table} t
         LEFT JOIN {table} c ON $1::text IS NOT NULL AND c.{key} = CAST($1 AS {key_type})
         WHERE {filter} AND ($1::text IS NULL OR {keyset})
         ORDER BY {order} LIMIT $2",
        columns = columns(found),
    );
    sqlx::query_as(&sql)
        .bind(after) // $1
        .bind(limit.clamp(1, JOBS_PAGE_MAX)) // $2
        .fetch_all(conn)
        .await
        .map_err(|e| read_error(found, after.unwrap_or(""), e))
}

fn read_error(found: &Found, key: &str, err: sqlx::Error) -> QueueError {
    if sqlstate(&err).is_some_and(|c| BAD_KEY_STATES.contains(&c.as_str())) {
        return QueueError::BadKey {
            name: found.name().to_string(),
            key: key.to_string(),
            key_type: found.key_type.clone(),
        };
    }
    unusable(found.name(), EngineError::db("listing a queue's jobs")(err))
}

/// One job, with its state and attempt history.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Job {
    /// What [`list`] shows.
    #[sqlx(flatten)]
    pub line: JobLine,
    /// eligible, processing, settled, failed or cancelled.
    pub status: String,
    /// The fence: raised by every claim.
    pub attempt: i32,
    /// Its attempt history, `[{attempt, at, error}]`, oldest first.
    pub errors: serde_json::Value,
    /// Its payload.
    pub payload: serde_json::Value,
}

/// The job keyed `key` of `found`; None when there is none.
pub(crate) async fn one(conn: &mut PgConnection, found: &Found, key: &str) -> Result<Option<Job>, QueueError> {
    let (table, column, key_type) = (found.queue.table(), &found.key_column, &found.key_type);
    let sql = format!(
        "SELECT {columns}, t.status, t.attempt, t.errors, t.payload FROM {table} t
         WHERE t.{column} = CAST($1 AS {key_type})",
        columns = columns(found),
    );
    sqlx::query_as(&sql)
        .bind(key) // $1
        .fetch_optional(conn)
        .await
        .map_err(|e| read_error(found, key, e))
}
