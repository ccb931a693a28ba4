//! settled-engine: PostgreSQL tables as exactly-once work queues.
//!
//! Workers split a work table's rows with `FOR NO KEY UPDATE SKIP LOCKED`,
//! so no worker waits for another, and the database itself guards every
//! effect: a row lock held for the whole transaction (in-transaction mode),
//! a fence carried from claim to completion (leased mode), status re-checks
//! in conditional updates, and unique keys.
//!
//! Two kinds of queue share those primitives:
//!
//! - a **continuous queue** ([`Queue`]): jobs enqueued inside the
//!   application's own transactions, served until stopped ([`serve()`](fn@serve),
//!   [`serve_leased`]), retried with backoff, kept as dead letters, pruned
//!   after a retention period (see `docs/queues.md`);
//! - a **batch job** ([`Job`]): a work table with a scope column (a day),
//!   drained once per scope by a run the engine starts, finishes (one
//!   finisher), cancels, resumes and retries; the scheduling [`daemon`]
//!   starts runs at their due times.
//!
//! A continuous queue, from enqueue to effect:
//!
//! ```no_run
//! use std::sync::Arc;
//! use settled_engine::{ClaimedJob, HandlerError, JobHandler, NewJob, Queue, ServeConfig, ServeStats};
//! use sqlx::{Connection, PgConnection, PgPool};
//!
//! struct SendReceipt;
//!
//! impl JobHandler for SendReceipt {
//!     async fn handle(&self, tx: &mut PgConnection, job: &ClaimedJob) -> Result<(), HandlerError> {
//!         // The effect, on the claiming transaction: it commits with the
//!         // job's completion, or neither does.
//!         sqlx::query("INSERT INTO shop.receipts (order_key) VALUES ($1)")
//!             .bind(&job.key)
//!             .execute(tx)
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn example(pool: PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! settled_engine::migrate(&pool).await?;
//! let queue = Arc::new(Queue::new("receipts", "shop.receipt_jobs")?);
//! queue.create_table(&mut *pool.acquire().await?).await?;
//!
//! // Enqueue in the application's own transaction: the order and its job
//! // commit together.
//! let mut conn = pool.acquire().await?;
//! let mut tx = conn.begin().await?;
//! sqlx::query("INSERT INTO shop.orders (id) VALUES (42)").execute(&mut *tx).await?;
//! queue.enqueue(&mut tx, &NewJob::new("order-42")).await?;
//! tx.commit().await?;
//!
//! // Serve until stopped (`stats.request_stop()`, e.g. on SIGTERM).
//! let stats = Arc::new(ServeStats::default());
//! settled_engine::serve(&pool, queue, Arc::new(SendReceipt), ServeConfig::default(), stats).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The crate's root names what an application needs; [`raw`] holds the
//! storage operations and loops that tools (reports, a bench, a dashboard)
//! use. See `examples/webhook_sender.rs` (a continuous queue, leased) and
//! `examples/email_digest.rs` (a batch job).

// Three floors: `common` is what both kinds of queue stand on; `batch`
// (jobs drained run by run) and `continuous` (queues served until stopped)
// each build on it, and neither uses the other. `daemon` is the public face
// of `batch::daemon`.
mod batch;
mod common;
pub mod continuous;
pub mod daemon;
mod migrate;
pub mod once;
pub mod raw;

// Both kinds of queue.
pub use common::error::{EngineError, HandlerError};
pub use common::fence::Fence;
pub use common::lease::LeaseConfig;
pub use common::retry::RetryPolicy;
pub use migrate::migrate;

// Continuous queues: declare, enqueue in a transaction, serve.
pub use continuous::{
    serve, serve_leased, ClaimedJob, Enqueued, JobHandler, LeasedJobHandler, NewJob, Queue, ServeConfig, ServeStats,
};

// Batch queues: a job over a scoped work table, drained run by run.
pub use batch::drain::ChunkHandler;
pub use batch::drainer::{ByMode, Drainer, InTransaction, Leased, RunTarget};
pub use batch::job::{Cancelled, Db, Job, NoHooks, Reopened, RunHooks, WorkOutcome};
pub use batch::leased::LeasedHandler;
pub use batch::queue::{ChunkSql, ChunkStatements, QueueSpec, StatusCounts, WorkQueue};
pub use batch::runs::{Joined, Run, RunCounts, RunState};
pub use batch::schedule::Schedule;
pub use batch::stats::{DrainConfig, DrainStats};
pub use batch::workers::Worker;
pub use common::item::{Chunk, ClaimedItem, Handled};
pub use common::status::ItemStatus;
