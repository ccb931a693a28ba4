//! Enqueueing: one job or thousands in one statement, on the caller's own
//! connection or transaction, so a job exists if and only if the caller's
//! transaction commits. A key already in the table is left alone, and the
//! answer says so. Each enqueue is a `queue.enqueue` span; a job given no
//! `traceparent` stores that span's, when the application traces, so the
//! job's work continues the trace that enqueued it.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use tracing::Instrument;

use super::{Names, Queue, MAX_BATCH_JOBS};
use crate::common::error::EngineError;

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    /// The job's key: unique in the queue's table; a key already there is
    /// not enqueued again.
    pub key: String,
    /// JSON text stored in the `payload` column (`{}` when empty).
    pub payload: String,
    /// Lower runs first (strictly before any higher value); 0 by default.
    pub priority: i16,
    /// Not claimed before this time (database clock); now by default.
    pub not_before: Option<DateTime<Utc>>,
    /// A W3C `traceparent` to store with the job.
    pub traceparent: Option<String>,
}

impl NewJob {
    /// A job with this key, an empty payload, priority 0, runnable now.
    pub fn new(key: impl Into<String>) -> NewJob {
        NewJob {
            key: key.into(),
            payload: "{}".into(),
            priority: 0,
            not_before: None,
            traceparent: None,
        }
    }

    /// With this payload (any `Serialize` value, stored as JSON).
    pub fn payload<T: serde::Serialize>(mut self, payload: &T) -> Result<NewJob, EngineError> {
        self.payload = serde_json::to_string(payload)
            .map_err(|e| EngineError::Config(format!("payload of job {}: {e}", self.key)))?;
        Ok(self)
    }

    /// With this priority (lower runs first).
    pub fn priority(mut self, priority: i16) -> NewJob {
        self.priority = priority;
        self
    }

    /// Not claimed before `at`.
    pub fn not_before(mut self, at: DateTime<Utc>) -> NewJob {
        self.not_before = Some(at);
        self
    }

    /// With this trace context.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> NewJob {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// The trace context stored with the job: its own, else the current
    /// span's (when the application traces).
    fn stored_traceparent(&self) -> Option<Cow<'_, str>> {
        match &self.traceparent {
            Some(own) => Some(Cow::Borrowed(own)),
            None => crate::common::telemetry::current_traceparent().map(Cow::Owned),
        }
    }
}

/// The span of an enqueue of `jobs` jobs (`key`: the one job's key).
fn enqueue_span(queue: &str, key: Option<&str>, jobs: usize) -> tracing::Span {
    tracing::info_span!("queue.enqueue", otel.kind = "producer", queue, key, jobs)
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// The job is new (it exists once the caller's transaction commits).
    New,
    /// A job with this key is already in the table: nothing was written.
    AlreadyThere,
}

#[derive(Debug, Clone)]
pub(super) struct Sql {
    one: String,
    many: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, key, key_type) = (n.table, n.key, n.key_type);
        Sql {
            one: format!(
                "INSERT INTO {table} ({key}, payload, priority, not_before, traceparent)
                 VALUES (CAST($1 AS {key_type}), CAST($2 AS jsonb), $3, coalesce($4, now()), $5)
                 ON CONFLICT ({key}) DO NOTHING
                 RETURNING true"
            ),
            // One statement for a whole batch: unnest keeps the rows in
            // the order given, so `seq` (enqueue order) follows it.
            many: format!(
                "INSERT INTO {table} ({key}, payload, priority, not_before, traceparent)
                 SELECT CAST(j.key AS {key_type}), CAST(j.payload AS jsonb), j.priority,
                        coalesce(j.not_before, now()), j.traceparent
                 FROM unnest($1::text[], $2::text[], $3::int2[], $4::timestamptz[], $5::text[])
                      WITH ORDINALITY AS j(key, payload, priority, not_before, traceparent, ord)
                 ORDER BY j.ord
                 ON CONFLICT ({key}) DO NOTHING"
            ),
        }
    }
}

impl Queue {
    /// Enqueues `job` on `conn` (the caller's transaction, or a connection
    /// in autocommit): one statement, no commit. Returns whether it is new.
    pub async fn enqueue(&self, conn: &mut PgConnection, job: &NewJob) -> Result<Enqueued, EngineError> {
        let span = enqueue_span(&self.name, Some(&job.key), 1);
        let traceparent = span.in_scope(|| job.stored_traceparent());
        let inserted: Option<bool> = sqlx::query_scalar(&self.sql.enqueue.one)
            .bind(&job.key) // $1
            .bind(&job.payload) // $2
            .bind(job.priority) // $3
            .bind(job.not_before) // $4
            .bind(traceparent.as_deref()) // $5
            .fetch_optional(conn)
            .instrument(span)
            .await
            .map_err(EngineError::db("enqueueing a job"))?;
        Ok(if inserted.is_some() {
            Enqueued::New
        } else {
            Enqueued::AlreadyThere
        })
    }

    /// Enqueues up to [`MAX_BATCH_JOBS`] jobs in one statement on `conn`, in
    /// the order given; keys already there are skipped. Returns how many
    /// are new.
    pub async fn enqueue_many(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<u64, EngineError> {
        if jobs.len() > MAX_BATCH_JOBS as usize {
            return Err(EngineError::Config(format!(
                "enqueue_many takes at most {MAX_BATCH_JOBS} jobs, got {}",
                jobs.len()
            )));
        }
        let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
        let payloads: Vec<&str> = jobs.iter().map(|j| j.payload.as_str()).collect();
        let priorities: Vec<i16> = jobs.iter().map(|j| j.priority).collect();
        let not_before: Vec<Option<DateTime<Utc>>> = jobs.iter().map(|j| j.not_before).collect();
        let span = enqueue_span(&self.name, None, jobs.len());
        let stored: Vec<Option<Cow<'_, str>>> = span.in_scope(|| jobs.iter().map(NewJob::stored_traceparent).collect());
        let traces: Vec<Option<&str>> = stored.iter().map(|t| t.as_deref()).collect();
        Ok(sqlx::query(&self.sql.enqueue.many)
            .bind(keys) // $1
            .bind(payloads) // $2
            .bind(priorities) // $3
            .bind(not_before) // $4
            .bind(traces) // $5
            .execute(conn)
            .instrument(span)
            .await
            .map_err(EngineError::db("enqueueing jobs"))?
            .rows_affected())
    }
}
