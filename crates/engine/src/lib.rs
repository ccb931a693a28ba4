//! settled-engine: turn any PostgreSQL table into an exactly-once work queue.
//!
//! Workers split the rows of a *work table* with `FOR NO KEY UPDATE SKIP
//! LOCKED`, so no worker waits for another, and every effect is guarded by the
//! database itself: a row lock held for the whole transaction (in-transaction
//! mode), status re-checks in conditional updates, and unique constraints in
//! the application's own tables.
//!
//! The engine owns: claiming chunks of items, marking them done, counting what
//! is left, runs (one per job and period), and the worker registry. It never
//! knows what an item *means*: the application's [`ChunkHandler`] does the work.
//!
//! A work table needs a scope column (what one run covers, e.g. a date), a
//! single key column (unique within a scope), and the columns listed in
//! [`queue::REQUIRED_COLUMNS`]. See `examples/email_digest.rs` for a job that
//! is not settlement.

pub mod error;
pub mod executor;
pub mod idempotency;
pub mod leased;
pub mod migrate;
pub mod named_lease;
pub mod once_token;
pub mod queue;
pub mod rescuer;
pub mod runs;
pub mod schedule;
pub mod status;
pub mod workers;

pub use error::{EngineError, HandlerError};
pub use executor::{drain_in_transactions, Chunk, ChunkHandler, ClaimedItem, DrainConfig, DrainStats, Handled};
pub use leased::{drain_leased, LeaseConfig, LeaseKeeper, LeasedHandler};
pub use queue::{FailOutcome, QueueSpec, RetryPolicy, WorkQueue};
pub use runs::{Run, RunState};
pub use schedule::Schedule;
pub use status::ItemStatus;
