//! The model's state: run rows, their items, the daemons and where each
//! one is in its step.

use super::Faults;

/// `settled_engine.runs.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    /// `running`
    Running,
    /// `finished`
    Finished,
    /// `cancelled`
    Cancelled,
}

/// A row of `settled_engine.runs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunRow {
    /// `scope`
    pub scope: u8,
    /// `state`
    pub state: RunState,
    /// The daemon whose transaction holds the row lock (`FOR NO KEY UPDATE`).
    pub locked_by: Option<u8>,
    /// Ghost: finishes since the run last became `running`.
    pub finishes: u8,
}

/// An item's `status` (one item per scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Item {
    /// `eligible`
    Eligible,
    /// `settled`
    Settled,
    /// `failed`
    Failed,
}

/// Where a daemon is in its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Waiting for something to do.
    Idle,
    /// `start_due_runs`, about to look at the `n`th due scope.
    Starting(u8),
    /// `start_due_runs` found no run for the scope; `start_or_join` next.
    StartTx(u8),
    /// `Job::work` on the running run of the scope.
    Working(u8),
    /// `finish_if_drained`: the REPEATABLE READ snapshot is taken, the
    /// statement waits for the run row's lock.
    FinishWaiting {
        /// The scope.
        scope: u8,
        /// The item as the snapshot sees it.
        seen: Item,
        /// The row was updated by another transaction after the snapshot.
        stale: bool,
    },
    /// `finish_if_drained`: the run row is locked.
    FinishLocked {
        /// The scope.
        scope: u8,
        /// The item as the snapshot sees it.
        seen: Item,
    },
}

/// A daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Daemon {
    /// Alive.
    pub up: bool,
    /// Where it is.
    pub phase: Phase,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// `settled_engine.runs`, in id order.
    pub runs: Vec<RunRow>,
    /// The work table: one item per scope.
    pub items: Vec<Item>,
    /// The daemons.
    pub daemons: Vec<Daemon>,
    /// Faults left.
    pub budget: Faults,
    /// Ghost: a finisher met 40001 (another finished first).
    pub saw_serialization_failure: bool,
    /// Ghost: a run was finished while a retry had made its item eligible.
    pub finished_with_work: bool,
    /// Ghost: a daemon reopened a finished run that had work again.
    pub reopened: bool,
}
