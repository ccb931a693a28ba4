//! Continuous queues as operators see them, for `settled queues`, the API,
//! the dashboard and `/metrics`: every registered queue with its exact state
//! (or why it cannot be read), its dead letters, and the checks around the
//! engine's verbs (pause, resume, cancel, replay) that turn a refusal into
//! an answer saying why. The verbs themselves are the engine's; this module
//! changes no job row of its own.

pub(crate) mod jobs;

use chrono::{DateTime, Utc};
use settled_engine::continuous::{registered_queues, QueueStats, RegisteredQueue, ReplayFilter, MAX_BATCH_JOBS};
use settled_engine::{EngineError, Queue};
use sqlx::PgConnection;

/// Dead letters a listing shows unless told otherwise.
pub(crate) const DEAD_LETTERS_SHOWN: u32 = 50;
/// Most dead letters one listing shows.
pub(crate) const MAX_DEAD_LETTERS_SHOWN: u32 = 1_000;
/// SQLSTATEs that say the queue's table cannot be used as it is: no such
/// table or column, no privilege on it.
const UNUSABLE_TABLE_STATES: [&str; 3] = ["42P01", "42703", "42501"];
/// SQLSTATEs of a key that is not a value of the key column's type.
const BAD_KEY_STATES: [&str; 3] = ["22P02", "22003", "22007"];
/// object_in_use: a trigger on the work table refused the change.
const REFUSED_BY_GUARD: &str = "55006";

/// A registered queue and what it holds now, or why that cannot be read.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Queue)]
pub(crate) struct QueueView {
    /// The queue's name.
    pub name: String,
    /// Its work table.
    pub table: String,
    /// True while paused (no claims).
    pub paused: bool,
    /// Since when.
    #[schema(required = true)]
    pub paused_at: Option<DateTime<Utc>>,
    /// Its jobs by state, exact (null when `error` says why not).
    #[schema(required = true)]
    pub stats: Option<QueueStats>,
    /// Why its table cannot be read: missing, not conforming, no privilege.
    #[schema(required = true)]
    pub error: Option<String>,
}

/// Why an operator's request about a queue cannot be answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueueError {
    /// No queue of that name is registered.
    #[error("no queue named {name:?} is registered (registered: {})", list(known))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The registered names.
        known: Vec<String>,
    },
    /// The queue is registered, but its table cannot serve.
    #[error("queue {name:?} cannot be used: {reason}")]
    Unusable {
        /// The queue.
        name: String,
        /// What is wrong with its table.
        reason: String,
    },
    /// A key that is not a value of the queue's key type.
    #[error("key {key:?} is not a {key_type}, the type of queue {name:?}'s key")]
    BadKey {
        /// The queue.
        name: String,
        /// The key as given.
        key: String,
        /// The key column's type.
        key_type: String,
    },
    /// The database failed.
    #[error(transparent)]
    Database(EngineError),
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// A registered queue found by name, with its statements and the validated
/// names of its key column and type.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// The registry's row.
    pub registered: RegisteredQueue,
    /// The engine's queue over its table.
    pub queue: Queue,
    key_column: String,
    key_type: String,
}

impl Found {
    /// The queue's name.
    pub(crate) fn name(&self) -> &str {
        &self.registered.name
    }
}

/// Every registered queue with its state, by name. A queue whose table
/// cannot be read is listed with the error.
pub(crate) async fn overview(conn: &mut PgConnection) -> Result<Vec<QueueView>, EngineError> {
    let mut views = Vec::new();
    for registered in registered_queues(conn).await? {
        views.push(view_of(conn, registered).await);
    }
    Ok(views)
}

/// One queue's state.
pub(crate) async fn view(conn: &mut PgConnection, name: &str) -> Result<QueueView, QueueError> {
    let registered = registered(conn, name).await?;
    Ok(view_of(conn, registered).await)
}

async fn view_of(conn: &mut PgConnection, registered: RegisteredQueue) -> QueueView {
    let stats = match registered.queue() {
        Ok(queue) => match queue.check_table(conn).await {
            Ok(()) => queue.stats(conn).await,
            Err(err) => Err(err),
        },
        Err(err) => Err(err),
    };
    let (stats, error) = match stats {
        Ok(stats) => (Some(stats), None),
        Err(err) => (None, Some(err.to_string())),
    };
    QueueView {
        paused: registered.paused(),
        name: registered.name,
        table: registered.table,
        paused_at: registered.paused_at,
        stats,
        error,
    }
}

async fn registered(conn: &mut PgConnection, name: &str) -> Result<RegisteredQueue, QueueError> {
    let all = registered_queues(conn).await.map_err(QueueError::Database)?;
    let known: Vec<String> = all.iter().map(|q| q.name.clone()).collect();
    all.into_iter()
        .find(|q| q.name == name)
        .ok_or_else(|| QueueError::Unknown {
            name: name.to_string(),
            known,
        })
}

/// The queue named `name`, its table not checked (pause and resume only
/// touch the registry).
pub(crate) async fn find(conn: &mut PgConnection, name: &str) -> Result<Found, QueueError> {
    let registered = registered(conn, name).await?;
    let queue = registered.queue().map_err(|e| unusable(name, e))?;
    Ok(Found {
        key_column: registered.key_column.clone().unwrap_or_else(|| "key".into()),
        key_type: registered.key_type.clone().unwrap_or_else(|| "text".into()),
        registered,
        queue,
    })
}

/// The queue named `name`, its table checked as every worker checks it.
pub(crate) async fn find_usable(conn: &mut PgConnection, name: &str) -> Result<Found, QueueError> {
    let found = find(conn, name).await?;
    found.queue.check_table(conn).await.map_err(|e| unusable(name, e))?;
    Ok(found)
}

/// An error about a queue's table: the table's fault (missing, not
/// conforming, no privilege), or the database's.
fn unusable(name: &str, err: EngineError) -> QueueError {
    let table_fault = match &err {
        EngineError::WorkTable { .. } | EngineError::InvalidIdentifier { .. } => true,
        EngineError::Database { source, .. } => {
            sqlstate(source).is_some_and(|c| UNUSABLE_TABLE_STATES.contains(&c.as_str()))
        }
        _ => false,
    };
    if table_fault {
        QueueError::Unusable {
            name: name.to_string(),
            reason: err.to_string(),
        }
    } else {
        QueueError::Database(err)
    }
}

fn sqlstate(err: &sqlx::Error) -> Option<String> {
    err.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned())
}

/// A dead letter: a job that failed for good, with its attempt history.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct DeadLetter {
    /// The job's key.
    pub key: String,
    /// Attempts counted toward the queue's limit (since its last replay).
    pub attempts: i32,
    /// Why its last attempt failed.
    #[schema(required = true)]
    pub last_error: Option<String>,
    /// When it failed for good.
    pub failed_at: DateTime<Utc>,
    /// Its attempt history, oldest first: `{attempt, at, error}` each, as
    /// the engine appends them.
    #[schema(value_type = Vec<Attempt>)]
    pub history: serde_json::Value,
}

/// One failed attempt of a dead letter, as the engine records it in the
/// work table's `errors` (the shape of [`DeadLetter::history`]).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Attempt {
    /// Which attempt (since the job's last replay).
    pub attempt: i64,
    /// When it failed.
    pub at: DateTime<Utc>,
    /// Why.
    #[schema(required = true)]
    pub error: Option<String>,
}

#[derive(sqlx::FromRow)]
struct DeadLetterRow {
    key: String,
    attempts: i32,
    last_error: Option<String>,
    failed_at: DateTime<Utc>,
    history: String,
}

/// The newest `limit` dead letters of a queue, newest failure first.
pub(crate) async fn dead_letters(
    conn: &mut PgConnection,
    found: &Found,
    limit: u32,
) -> Result<Vec<DeadLetter>, QueueError> {
    // Names validated by the engine's Queue; the status test repeats the
    // finished index's predicate so the planner reads that index.
    let sql = format!(
        "SELECT t.{key}::text AS key, t.attempt - t.attempt_base AS attempts, t.last_error,
                t.updated_at AS failed_at, t.errors::text AS history
         FROM {table} t
         WHERE t.status IN ('settled', 'failed', 'cancelled') AND t.status = 'failed'
         ORDER BY t.updated_at DESC
         LIMIT $1",
        key = found.key_column,
        table = found.queue.table()
    );
    let rows: Vec<DeadLetterRow> = sqlx::query_as(&sql)
        .bind(i64::from(limit.min(MAX_DEAD_LETTERS_SHOWN))) // $1
        .fetch_all(conn)
        .await
        .map_err(|e| unusable(found.name(), EngineError::db("listing dead letters")(e)))?;
    Ok(rows
        .into_iter()
        .map(|r| DeadLetter {
            key: r.key,
            attempts: r.attempts,
            last_error: r.last_error,
            failed_at: r.failed_at,
            history: serde_json::from_str(&r.history).unwrap_or(serde_json::Value::Null),
        })
        .collect())
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// Cancelled now: the job will not run.
    Now,
    /// The queue has no job with this key.
    NoSuchJob,
    /// The job has started or ended: why it could not be cancelled.
    Refused(String),
}

/// Cancels a job that has not started; when the engine refuses, reads the
/// job's status to say why.
pub(crate) async fn cancel(conn: &mut PgConnection, found: &Found, key: &str) -> Result<Cancelled, QueueError> {
    let bad_key = |err: EngineError| match &err {
        EngineError::Database { source, .. }
            if sqlstate(source).is_some_and(|c| BAD_KEY_STATES.contains(&c.as_str())) =>
        {
            QueueError::BadKey {
                name: found.name().to_string(),
                key: key.to_string(),
                key_type: found.key_type.clone(),
            }
        }
        _ => unusable(found.name(), err),
    };
    match found.queue.cancel(conn, key).await {
        Ok(true) => return Ok(Cancelled::Now),
        Ok(false) => {}
        // A guard on the work table refused (the payout delivery queue's
        // guard: a queued payout's delivery is never cancelled).
        Err(EngineError::Database { source, .. }) if sqlstate(&source).as_deref() == Some(REFUSED_BY_GUARD) => {
            let db = source.as_database_error().expect("a database error has a code");
            return Ok(Cancelled::Refused(db.message().to_string()));
        }
        Err(err) => return Err(bad_key(err)),
    }
    let sql = format!(
        "SELECT t.status FROM {table} t WHERE t.{key} = CAST($1 AS {key_type})",
        table = found.queue.table(),
        key = found.key_column,
        key_type = found.key_type
    );
    let status: Option<String> = sqlx::query_scalar(&sql)
        .bind(key) // $1
        .fetch_optional(conn)
        .await
        .map_err(|e| bad_key(EngineError::db("reading a job's status")(e)))?;
    Ok(match status.as_deref() {
        None => Cancelled::NoSuchJob,
        Some("eligible") => Cancelled::Refused("it is being handled in a worker's transaction".into()),
        Some("processing") => Cancelled::Refused("it has started: it is processing under a lease".into()),
        Some(other) => Cancelled::Refused(format!("it has ended: its status is {other}")),
    })
}

/// A replay's filter as an operator gives it; every field optional.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplayRequest {
    /// This job only.
    pub key: Option<String>,
    /// Jobs whose last error contains this text.
    pub error_contains: Option<String>,
    /// Jobs that failed at or after this time (RFC 3339).
    pub failed_since: Option<String>,
    /// Jobs that failed before this time (RFC 3339).
    pub failed_before: Option<String>,
    /// At most this many (1..=10,000; all of that many by default).
    pub limit: Option<u64>,
}

/// A field of a request that is not valid: its name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    /// The field as the API names it (`failed_since`; the CLI's flag is
    /// `--failed-since`).
    pub field: &'static str,
    /// What is wrong with it, to follow its name.
    pub why: String,
}

impl FieldError {
    /// The error as one line that starts with the field's name as `name`.
    pub(crate) fn named(&self, name: &str) -> String {
        format!("{name} {}", self.why)
    }

    /// The CLI's flag for the field.
    pub(crate) fn flag(&self) -> String {
        format!("--{}", self.field.replace('_', "-"))
    }
}

/// Parses an RFC 3339 time, naming `field` when it is not one.
pub(crate) fn parse_time(field: &'static str, text: &str) -> Result<DateTime<Utc>, FieldError> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| FieldError {
            field,
            why: format!("must be an RFC 3339 time such as 2026-12-03T10:00:00Z, not {text:?} ({e})"),
        })
}

impl ReplayRequest {
    /// The engine's filter: every field checked and named when invalid.
    pub(crate) fn filter(&self) -> Result<ReplayFilter, FieldError> {
        let refuse = |field: &'static str, why: String| Err(FieldError { field, why });
        let limit = self.limit.unwrap_or(u64::from(MAX_BATCH_JOBS));
        if !(1..=u64::from(MAX_BATCH_JOBS)).contains(&limit) {
            return refuse("limit", format!("must be 1..={MAX_BATCH_JOBS}, got {limit}"));
        }
        if self.key.as_deref().is_some_and(str::is_empty) {
            return refuse("key", "must not be empty".into());
        }
        if self.error_contains.as_deref().is_some_and(str::is_empty) {
            return refuse("error_contains", "must not be empty".into());
        }
        let since = self
            .failed_since
            .as_deref()
            .map(|t| parse_time("failed_since", t))
            .transpose()?;
        let before = self
            .failed_before
            .as_deref()
            .map(|t| parse_time("failed_before", t))
            .transpose()?;
        if let (Some(since), Some(before)) = (since, before) {
            if since >= before {
                return refuse(
                    "failed_before",
                    format!(
                        "({}) must be later than the window's start ({})",
                        before.to_rfc3339(),
                        since.to_rfc3339()
                    ),
                );
            }
        }
        Ok(ReplayFilter {
            key: self.key.clone(),
            error_contains: self.error_contains.clone(),
            failed_since: since,
            failed_before: before,
            limit: limit as u32,
        })
    }
}

/// A filter in words, for answers ("key \"k\", last error containing ...").
pub(crate) fn describe(filter: &ReplayFilter) -> String {
    let mut parts = Vec::new();
    if let Some(key) = &filter.key {
        parts.push(format!("key {key:?}"));
    }
    if let Some(text) = &filter.error_contains {
        parts.push(format!("last error containing {text:?}"));
    }
    if let Some(t) = filter.failed_since {
        parts.push(format!("failed since {}", t.to_rfc3339()));
    }
    if let Some(t) = filter.failed_before {
        parts.push(format!("failed before {}", t.to_rfc3339()));
    }
    if parts.is_empty() {
        "any dead letter".to_string()
    } else {
        parts.join(", ")
    }
}

/// Replays the dead letters `filter` selects; how many.
pub(crate) async fn replay(conn: &mut PgConnection, found: &Found, filter: &ReplayFilter) -> Result<u64, QueueError> {
    found
        .queue
        .replay(conn, filter)
        .await
        .map_err(|e| unusable(found.name(), e))
}

#[cfg(test)]
mod tests {
    use super::{parse_time, ReplayRequest};

    #[test]
    fn a_replay_request_names_the_field_at_fault() {
        let bad = |r: ReplayRequest| r.filter().unwrap_err().field;
        assert_eq!(
            bad(ReplayRequest {
                limit: Some(0),
                ..Default::default()
            }),
            "limit"
        );
        assert_eq!(
            bad(ReplayRequest {
                limit: Some(10_001),
                ..Default::default()
            }),
            "limit"
        );
        assert_eq!(
            bad(ReplayRequest {
                failed_since: Some("yesterday".into()),
                ..Default::default()
            }),
            "failed_since"
        );
        assert_eq!(
            bad(ReplayRequest {
                failed_since: Some("2026-12-03T10:00:00Z".into()),
                failed_before: Some("2026-12-03T09:00:00+00:00".into()),
                ..Default::default()
            }),
            "failed_before"
        );
        assert_eq!(
            bad(ReplayRequest {
                error_contains: Some(String::new()),
                ..Default::default()
            }),
            "error_contains"
        );
        let all = ReplayRequest::default().filter().unwrap();
        assert_eq!((all.limit, all.key), (10_000, None));
        let at = parse_time("failed_since", "2026-12-03T11:00:00+01:00").unwrap();
        assert_eq!(at.to_rfc3339(), "2026-12-03T10:00:00+00:00");
    }
}
