//! The runs model: several daemons on the same due times, start-or-join
//! under the unique keys, catch-up oldest first, draining, the
//! one-finisher protocol (run-row lock, REPEATABLE READ, 40001), cancel and
//! resume, retry and reopen, and a daemon killed in the middle.
//!
//! It models `crates/engine/src/batch/daemon.rs` (`step`, `start_due_runs`),
//! `job.rs` (`start_or_join`, `work`, `finish_if_drained`, `cancel`,
//! `resume`, `retry_failed`, `reopen_oldest_with_work`) and `runs.rs`
//! (the statements on `settled_engine.runs`). Items are one per scope and
//! settle in one step (their claims are the leased model's subject); every
//! scope is due from the start, as after an outage (catch-up).
//!
//! A daemon polls only when a poll would find something to do (a run to
//! start, reopen or work on): a poll that finds nothing changes nothing,
//! and leaving it out keeps every behaviour finite.

mod action;
mod bounds;
mod described;
mod model;
mod state;
mod steps;

pub use action::Action;
pub use state::{Daemon, Item, Phase, RunRow, RunState, State};

/// Faults and operator actions, each at most this many times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A daemon killed (its open transaction rolls back; it stays down).
    pub crashes: u8,
    /// An item failing for good (a permanent error).
    pub item_failures: u8,
    /// `settled runs cancel` by an operator (who later resumes).
    pub cancels: u8,
    /// `settled retry` by an operator.
    pub retries: u8,
}

/// The guards a variant may go without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guards {
    /// The partial unique index `runs_one_running_per_job`.
    pub one_running_per_job: bool,
}

impl Guards {
    /// Every guard the code has.
    pub const ALL: Guards = Guards {
        one_running_per_job: true,
    };
}

/// The runs model at some bounds.
#[derive(Debug, Clone)]
pub struct Runs {
    /// Daemons (each also works on the running run).
    pub daemons: u8,
    /// Scopes due, oldest first.
    pub scopes: u8,
    /// Faults and operator actions.
    pub faults: Faults,
    /// The guards in force.
    pub guards: Guards,
}

/// Property names.
pub mod property {
    /// Safety: the unique key `(job, scope)`.
    pub const ONE_RUN_PER_SCOPE: &str = "at most one run per job and scope";
    /// Safety: the partial unique index.
    pub const ONE_RUNNING: &str = "at most one running run per job";
    /// Safety: one finisher.
    pub const ONE_FINISHER: &str = "each run is finished by one finisher";
    /// Safety: catch-up, oldest first.
    pub const OLDEST_FIRST: &str = "missed runs start oldest first";
    /// Liveness.
    pub const EVERY_SCOPE_FINISHED: &str = "every due scope ends with a finished run and its items final";
}
