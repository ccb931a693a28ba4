//! Continuous queues: a work table with no scope and no run, fed by
//! enqueues inside the application's own transactions and served until
//! stopped.
//!
//! The table is the queue. A job exists if and only if the transaction that
//! inserted its row committed, whether the row came from [`Queue::enqueue`],
//! [`Queue::enqueue_many`] or a plain `INSERT` from any language; its key is
//! the table's primary key, so enqueuing a key twice makes one job. A
//! statement trigger notifies the queue's workers at commit. Claims take
//! jobs by priority (lower first), then by when they may run (`not_before`),
//! then in enqueue order (`seq`), with `FOR NO KEY UPDATE SKIP LOCKED`, and
//! only while the queue is not paused.
//!
//! Jobs are served in either mode ([`serve()`](fn@crate::serve), [`crate::serve_leased`]): in-transaction (the handler's
//! effects and the job's completion commit together) or leased (a lease
//! renewed while the work runs, a fenced completion, a rescue of expired
//! leases). A failed attempt is retried with exponential backoff and jitter
//! until the queue's attempts are spent; the job then stays `failed` with
//! its attempt history, a dead letter, until replayed. Finished jobs leave
//! the table after a retention period ([`Queue::prune`]).
//!
//! Exactly-once evidence belongs in the effect's own unique key (a ledger
//! key, a provider's idempotency key derived from the job's key), never in
//! the job row alone: the row is deleted once its retention passes, and a
//! key enqueued again after that is a new job.
//!
//! Each operation's statements sit in the file of the operation:
//! `enqueue.rs`, `claim.rs`, `finish.rs` (complete, fail, snooze), `lease.rs`
//! (renew, release, rescue), `manage.rs` (pause, resume, cancel, replay),
//! `retention.rs`, `stats.rs`; `table.rs` creates and checks a conforming
//! table; `registry.rs` lists the registered queues for tools; `serve/`
//! runs the workers.

mod claim;
mod enqueue;
mod finish;
pub mod lease;
mod manage;
mod registry;
mod retention;
pub mod serve;
mod stats;
mod table;

use std::time::Duration;

pub use enqueue::{Enqueued, NewJob};
pub use manage::ReplayFilter;
pub use registry::{registered_queues, RegisteredQueue};
pub use serve::{serve, serve_leased, JobHandler, LeasedJobHandler, ServeConfig, ServeStats, Wake};
pub use stats::QueueStats;
pub use table::{CONTINUOUS_COLUMNS, CONTINUOUS_INDEXES};

use crate::common::error::{EngineError, HandlerError};
use crate::common::fence::Fence;
use crate::common::ident::check_identifier;

/// The channel the wake-up trigger notifies, with the queue's name as payload.
pub const WAKE_CHANNEL: &str = "settled_engine_queue";
/// Most jobs one claim or one bulk enqueue takes.
pub const MAX_BATCH_JOBS: u32 = 10_000;
/// Entries of a job's attempt history kept (the oldest are dropped).
pub const MAX_ERRORS_KEPT: i32 = 20;

/// A continuous queue: its name and its work table, with the statements
/// rendered once from validated identifiers.
#[derive(Debug, Clone)]
pub struct Queue {
    name: String,
    table: String,
    key: String,
    key_type: String,
    sql: Statements,
}

/// Every statement of a continuous queue, rendered once.
#[derive(Debug, Clone)]
struct Statements {
    enqueue: enqueue::Sql,
    claim: claim::Sql,
    finish: finish::Sql,
    lease: lease::Sql,
    manage: manage::Sql,
    retention: retention::Sql,
    stats: stats::Sql,
}

/// The validated identifiers a queue's statements are rendered from.
struct Names<'a> {
    table: &'a str,
    key: &'a str,
    key_type: &'a str,
}

impl Queue {
    /// A queue named `name` on `table` (`schema.table` or `table`) whose key
    /// column is `key` of type `text`. Names are lower-case SQL identifiers.
    pub fn new(name: &str, table: &str) -> Result<Queue, EngineError> {
        Queue::with_key(name, table, "key", "text")
    }

    /// A queue whose key column and type are given (`bigint`, `uuid`, ...).
    pub fn with_key(name: &str, table: &str, key: &str, key_type: &str) -> Result<Queue, EngineError> {
        check_identifier("queue name", name, false)?;
        check_identifier("table", table, true)?;
        check_identifier("key_column", key, false)?;
        check_identifier("key_type", key_type, false)?;
        let names = Names { table, key, key_type };
        let sql = Statements {
            enqueue: enqueue::Sql::render(&names),
            claim: claim::Sql::render(&names),
            finish: finish::Sql::render(&names),
            lease: lease::Sql::render(&names),
            manage: manage::Sql::render(&names),
            retention: retention::Sql::render(&names),
            stats: stats::Sql::render(&names),
        };
        Ok(Queue {
            name: name.to_string(),
            table: table.to_string(),
            key: key.to_string(),
            key_type: key_type.to_string(),
            sql,
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its work table.
    pub fn table(&self) -> &str {
        &self.table
    }
}

/// A claimed job, as a handler receives it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimedJob {
    /// The job's key: pass it (or a key derived from it) to any external
    /// call as its idempotency key.
    pub key: String,
    /// This claim of the job: record it with the effect.
    pub fence: Fence,
    /// The job's `payload` column, as JSON text.
    pub payload: String,
    /// Its priority (lower runs first).
    pub priority: i16,
    /// The W3C `traceparent` stored with the job, if any.
    pub traceparent: Option<String>,
    /// Attempts counted toward the queue's limit, this one included.
    pub attempt: i32,
}

impl ClaimedJob {
    /// The payload decoded as `T`; a payload that does not decode is a
    /// permanent failure naming the field.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_str(&self.payload)
            .map_err(|e| HandlerError::Permanent(format!("payload of job {}: {e}", self.key)))
    }
}

/// A claimed row as the claim statements return it.
#[derive(sqlx::FromRow)]
struct JobRow {
    key: String,
    fence: Fence,
    payload: String,
    priority: i16,
    traceparent: Option<String>,
    attempt: i32,
    /// From when it could run (enqueued, or its `not_before`) to the claim,
    /// on the database's clock.
    waited_ms: f64,
}

impl JobRow {
    fn into_job(self) -> (ClaimedJob, Duration) {
        let waited = Duration::from_secs_f64(self.waited_ms.max(0.0) / 1_000.0);
        let job = ClaimedJob {
            key: self.key,
            fence: self.fence,
            payload: self.payload,
            priority: self.priority,
            traceparent: self.traceparent,
            attempt: self.attempt,
        };
        (job, waited)
    }
}

/// Splits jobs into the key and fence arrays the fenced statements bind.
fn keys_and_fences(jobs: &[ClaimedJob]) -> (Vec<String>, Vec<i64>) {
    jobs.iter().map(|j| (j.key.clone(), j.fence.packed())).unzip()
}
