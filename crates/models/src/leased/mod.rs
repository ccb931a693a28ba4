//! The leased-work model: claims, leases on the database clock, renewal,
//! rescue, the fenced completion, the provider call with its idempotency
//! key, and the faults around them (a worker crashed, a worker paused past
//! its lease, a provider that fails or applies and then times out, a
//! failover that loses a suffix of commits and bumps the timeline, a
//! synchronous failover), beside in-transaction claims and a crash in the
//! middle of their transaction.
//!
//! It models, in `crates/engine/src/`, `batch/leased.rs` (the claim loop),
//! `common/lease.rs` (the lease keeper), `batch/queue/claim.rs`,
//! `queue/complete.rs`, `queue/fail.rs`, `queue/lease.rs`, `batch/rescuer.rs`,
//! `common/fence.rs` and `batch/queue/statement.rs` (in-transaction chunks),
//! with settlement's leased handler (`crates/settled/src/settlement/leased.rs`,
//! `SettleWithProvider`) and its provider (`provider.rs`). A chunk is one
//! item here: every statement is set-based and its conditions are per row.
//!
//! Ghost state (what the world knows, not a column) is marked so: the id of
//! each claim, whether a completion was accepted for a claim that no longer
//! held the row.

mod action;
mod bounds;
mod described;
mod effects;
mod enabled;
mod model;
mod state;

pub use action::{Action, Answer};
pub use state::{Fence, Job, Lease, Payment, Row, State, Status, Worker};

/// Whether commits reach the standby before they are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Replication {
    /// `synchronous_commit = on` with a synchronous standby: a failover
    /// loses nothing and bumps the timeline.
    Synchronous,
    /// The default: the standby replays what it has received; a failover
    /// loses the commits it had not, and bumps the timeline.
    Asynchronous,
}

/// Faults the environment may inject, each at most this many times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A worker process killed (SIGKILL): its memory and its open
    /// transaction are gone; it does not come back (the others stand in).
    pub crashes: u8,
    /// A worker stopped (SIGSTOP, a long GC, a frozen VM) and continued later.
    pub pauses: u8,
    /// A running worker's lease expiring anyway (renewals delayed past the ttl).
    pub slow_renewals: u8,
    /// The provider answering 503 before applying anything.
    pub provider_unavailable: u8,
    /// The provider applying the payment, then the caller timing out.
    pub applied_then_timed_out: u8,
    /// Failovers (of the kind [`Replication`] says).
    pub failovers: u8,
}

/// The guards a variant of the model may go without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guards {
    /// The fenced statements compare the row's fence with the claim's
    /// (`ROW_FENCE = f.fence` in `complete_fenced`, `fail_fenced`,
    /// `renew_leases`). Without it they check the status alone.
    pub fence: bool,
    /// The fence includes the timeline (`fence_epoch`). Without it the
    /// fence is the attempt alone.
    pub timeline: bool,
    /// The provider call carries a key derived from the item
    /// (`payout_key(period, creator)`). Without it, each call carries a key
    /// of its own (as a key derived from the attempt would, or no key).
    pub idempotency_key: bool,
}

impl Guards {
    /// Every guard the code has.
    pub const ALL: Guards = Guards {
        fence: true,
        timeline: true,
        idempotency_key: true,
    };
}

/// The leased-work model at some bounds.
#[derive(Debug, Clone)]
pub struct LeasedWork {
    /// Items of the scope (rows of the work table).
    pub items: u8,
    /// Workers in leased mode.
    pub leased_workers: u8,
    /// Workers in in-transaction mode.
    pub tx_workers: u8,
    /// `RetryPolicy::max_attempts`.
    pub max_attempts: u8,
    /// The kind of replication, and so of failover.
    pub replication: Replication,
    /// Faults to inject.
    pub faults: Faults,
    /// The guards in force.
    pub guards: Guards,
}

/// Property names (the tests refer to them).
pub mod property {
    /// Safety: the handler's effects of an item committed at most once.
    pub const EFFECT_AT_MOST_ONCE: &str = "each item's effect is applied at most once";
    /// Safety: the effect commits with the `settled` status, never apart.
    pub const EFFECT_WITH_STATUS: &str = "an item is settled exactly when its effect is committed";
    /// Safety: no completion accepted for a claim that lost the row.
    pub const NO_STALE_COMPLETION: &str = "no completion is accepted under a stale fence";
    /// Safety: the provider pays each item at most once.
    pub const PAID_AT_MOST_ONCE: &str = "the provider pays each item at most once";
    /// Safety: one payment per key, with the item's amount.
    pub const KEY_ONCE_WITH_AMOUNT: &str = "the provider applies each key at most once, with its amount";
    /// Liveness: every item ends settled or failed.
    pub const EVERY_ITEM_FINAL: &str = "every item ends settled or failed";
}
