//! What tools need and applications do not: the storage operations behind
//! both kinds of queue (each statement of a work table, runs, the worker
//! registry, key ranges), the drain loops themselves, metric names and
//! session settings. `settled` uses them for its reports, its bench and its
//! dashboard; an application of the engine needs only the crate's root.

pub use crate::batch::drain::drain_in_transactions;
pub use crate::batch::job::FINISH_RETRY_FOR;
pub use crate::batch::leased::drain_leased;
pub use crate::batch::queue::{ChunkDone, KeyWindow, MAX_CHUNK_ITEMS, REQUIRED_COLUMNS, REQUIRED_INDEXES};
pub use crate::batch::rescuer::{keep_rescuing, rescue_expired_leases};
pub use crate::batch::schedule::MAX_CATCH_UP_DAYS;
pub use crate::common::backoff::{MAX_CONCURRENCY, MAX_RETRY_BACKOFF_MS};
pub use crate::common::error::{is_deployment_fault, is_transient_sqlx, is_unique_violation};
pub use crate::common::lease::{
    LeaseKeeper, COMPLETION_RETRIES, DEFAULT_CALLS_IN_FLIGHT, MAX_CALLS_IN_FLIGHT, MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS,
};
pub use crate::common::outage::OutageClock;
pub use crate::common::retry::{FailOutcome, Failure, DEFAULT_MAX_ATTEMPTS};
pub use crate::migrate::migrator;

/// A job's runs: one per job and scope (see [`crate::Job`] for the lifecycle).
pub mod runs {
    pub use crate::batch::runs::{
        count_by_state, find, get, is_running, list, notify_items_eligible, running, ITEMS_CHANNEL, RUNS_CHANNEL,
    };
}

/// The worker registry and its heartbeat.
pub mod workers {
    pub use crate::batch::workers::{
        heartbeat, list, mark_dead_and_prune, stopped, totals, RegistryUpkeep, WorkerRow, WorkerTotals,
        WORKER_DEAD_AFTER_SECS, WORKER_HEARTBEAT_SECS, WORKER_RETENTION_DAYS, WORKER_STOP_RECORD_MS,
    };
}

/// Session settings the engine's statements rely on.
pub mod session {
    pub use crate::common::session::*;
}

/// Metric names, and the hooks that continue stored trace contexts.
pub mod telemetry {
    pub use crate::common::telemetry::*;
}
