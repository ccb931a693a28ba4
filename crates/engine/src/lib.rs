//! settled-engine: turn any PostgreSQL table into an exactly-once work queue.
//!
//! Workers split the rows of a *work table* with `FOR NO KEY UPDATE SKIP
//! LOCKED`, so no worker waits for another, and every effect is guarded by the
//! database itself: a row lock held for the whole transaction (in-transaction
//! mode), a fence carried from claim to completion (leased mode), status
//! re-checks in conditional updates, and unique constraints.
//!
//! An application declares a [`Job`] (a [`WorkQueue`] over its table, and
//! [`RunHooks`]) and a handler ([`ChunkHandler`] or [`LeasedHandler`]); the
//! engine owns the rest of the lifecycle: runs (one per job and scope),
//! draining, finishing (one finisher), cancel, resume, retry, releasing held
//! items, reopening, the rescuer, the scheduling [`daemon`], and the worker
//! registry. The application writes no SQL against the engine's tables.
//!
//! A work table needs a scope column (what one run covers, e.g. a date), a
//! single key column (unique within a scope), the columns in
//! [`queue::REQUIRED_COLUMNS`] and the indexes in [`queue::REQUIRED_INDEXES`];
//! [`Job::check_work_table`] names whatever is missing. A work table may be
//! partitioned by its scope; give the engine sessions with custom plans then
//! ([`session::use_custom_plans`]). See `examples/email_digest.rs` for a job
//! that is not settlement.

pub mod continuous;
pub mod daemon;
pub mod drain;
pub mod error;
pub mod fence;
pub mod item;
pub mod job;
pub mod leased;
pub mod migrate;
pub mod once;
pub mod queue;
mod ranges;
pub mod rescuer;
pub mod runs;
pub mod schedule;
pub mod session;
pub mod status;
pub mod telemetry;
pub mod workers;

pub use continuous::{
    serve, serve_leased, ClaimedJob, Enqueued, JobHandler, LeasedJobHandler, NewJob, Queue, ServeConfig, ServeStats,
};
pub use daemon::DaemonConfig;
pub use drain::{drain_in_transactions, ChunkHandler, DrainConfig, DrainStats};
pub use error::{EngineError, HandlerError};
pub use fence::Fence;
pub use item::{Chunk, ClaimedItem, Handled};
pub use job::{
    ByMode, Cancelled, Drainer, InTransaction, Job, Leased, NoHooks, Reopened, RunHooks, RunTarget, WorkOutcome,
};
pub use leased::{drain_leased, LeaseConfig, LeaseKeeper, LeasedHandler};
pub use migrate::migrate;
pub use queue::{ChunkDone, ChunkSql, ChunkStatements, FailOutcome, KeyWindow, QueueSpec, RetryPolicy, WorkQueue};
pub use runs::{Run, RunState};
pub use schedule::Schedule;
pub use status::ItemStatus;
pub use workers::Worker;
