//! The model's state: rows, their fences and leases, workers, the
//! provider's payments, the primary and its standby.

use std::fmt;

use super::Faults;

/// A row's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// `eligible`
    Eligible,
    /// `processing` (leased)
    Processing,
    /// `settled`
    Settled,
    /// `failed`
    Failed,
}

/// A fence: `(fence_epoch << 32) | attempt` (`crates/engine/src/common/fence.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    /// `fence_epoch`: the timeline of the primary that granted the claim
    /// (0 for in-transaction claims).
    pub epoch: u8,
    /// `attempt`.
    pub attempt: u8,
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.attempt, self.epoch)
    }
}

/// A row of the work table (`settlement.token_trade_volume`), with the
/// effects its completion writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    /// `status`
    pub status: Status,
    /// `attempt`
    pub attempt: u8,
    /// `fence_epoch`
    pub fence_epoch: u8,
    /// `lease_owner` (the worker)
    pub lease_owner: Option<u8>,
    /// `lease_until > now()` on the database clock.
    pub lease_live: bool,
    /// Rows the handler's commit wrote for the item: `settlement.reward_ledger`
    /// (and the balance credit beside it). Its primary key is left out, so
    /// the engine's own guards are what is checked.
    pub effects: u8,
    /// Ghost: the claim that last set the row `processing` (or locked it).
    pub claim: Option<u8>,
    /// Ghost: the claim whose completion settled the row.
    pub settled_by: Option<u8>,
}

/// What a worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Job {
    /// Between chunks.
    Idle,
    /// Leased: the claim committed; `held` is `LeaseKeeper::is_held`.
    Claimed(Lease),
    /// Leased: `is_held` said yes and a call slot was granted; the call is
    /// about to be sent (a pause here sends it late).
    Working(Lease),
    /// Leased: the provider answered (`ok`: paid; else a transient error).
    Called(Lease, bool),
    /// In-transaction: the rows are locked and the effects written in the
    /// open transaction; nothing is visible until the commit.
    InTx {
        /// The item.
        item: u8,
        /// The attempt the commit writes.
        fence: Fence,
        /// Ghost: the claim's id.
        claim: u8,
    },
}

/// A leased claim as a worker holds it in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The item.
    pub item: u8,
    /// The fence the claim returned.
    pub fence: Fence,
    /// Ghost: the claim's id.
    pub claim: u8,
    /// `LeaseKeeper::is_held`: the lease is known to be valid on the
    /// worker's own clock.
    pub held: bool,
}

/// A worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Worker {
    /// Alive (not SIGKILLed).
    pub up: bool,
    /// Stopped (SIGSTOP): it takes no step until continued.
    pub paused: bool,
    /// In-transaction mode (else leased).
    pub in_tx: bool,
    /// What it is doing.
    pub job: Job,
}

impl Worker {
    pub(super) fn running(&self) -> bool {
        self.up && !self.paused
    }

    pub(super) fn lease(&self) -> Option<Lease> {
        match self.job {
            Job::Claimed(l) | Job::Working(l) | Job::Called(l, _) => Some(l),
            _ => None,
        }
    }

    pub(super) fn set_lease(&mut self, lease: Lease) {
        match &mut self.job {
            Job::Claimed(l) | Job::Working(l) | Job::Called(l, _) => *l = lease,
            _ => {}
        }
    }
}

/// A payment the provider applied: its idempotency key (the item, and the
/// claim when the key is not derived from the item alone) and its amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Payment {
    /// The item paid.
    pub item: u8,
    /// The claim, when each call has a key of its own.
    pub claim: Option<u8>,
    /// The amount.
    pub amount: u8,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The primary's committed rows.
    pub primary: Vec<Row>,
    /// What the standby has replayed (asynchronous replication).
    pub standby: Vec<Row>,
    /// The primary's timeline: `settled_engine.fence_epoch()`.
    pub timeline: u8,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Payments the provider applied, one per key (outside the database:
    /// a failover does not undo them).
    pub payments: Vec<Payment>,
    /// Faults left to inject.
    pub budget: Faults,
    /// Ghost: claims made so far (the next claim's id).
    pub claims: u8,
    /// Ghost: a completion was accepted for a claim that did not hold the row.
    pub stale_completion_accepted: bool,
    /// Ghost: a completion was refused for a claim that did not hold the row.
    pub stale_completion_refused: bool,
    /// Ghost: a claim was handed the attempt number of a claim lost in a failover.
    pub attempt_handed_out_twice: bool,
    /// Ghost: a worker died with its transaction open.
    pub tx_crashed: bool,
}

pub(super) fn amount_of(item: u8) -> u8 {
    item + 1
}
