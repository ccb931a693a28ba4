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
mod drain;
mod error;
mod fence;
mod item;
mod job;
mod leased;
mod migrate;
pub mod once;
mod queue;
mod ranges;
pub mod raw;
mod rescuer;
mod runs;
mod schedule;
mod session;
mod status;
mod telemetry;
mod workers;

// Both kinds of queue.
pub use error::{EngineError, HandlerError};
pub use fence::Fence;
pub use migrate::migrate;

// Continuous queues: declare, enqueue in a transaction, serve.
pub use continuous::{
    serve, serve_leased, ClaimedJob, Enqueued, JobHandler, LeasedJobHandler, NewJob, Queue, ServeConfig, ServeStats,
};

// Batch queues: a job over a scoped work table, drained run by run.
pub use drain::{ChunkHandler, DrainConfig};
pub use item::{Chunk, Handled};
pub use job::{InTransaction, Job, Leased, NoHooks, RunHooks, WorkOutcome};
pub use leased::{LeaseConfig, LeasedHandler};
pub use queue::QueueSpec;
pub use workers::Worker;

// Inside the crate, the names every module uses.
pub(crate) use drain::DrainStats;
pub(crate) use item::ClaimedItem;
pub(crate) use queue::WorkQueue;
pub(crate) use schedule::Schedule;
