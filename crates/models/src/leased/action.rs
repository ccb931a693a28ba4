//! What can happen: each action names the function and the statement it
//! models; and how the provider answers.

use std::fmt;

use crate::signal::Signal;

/// What can happen. Each action names the function and the statement it models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Models `claim_leased` in crates/engine/src/batch/queue/claim.rs: `WITH
    /// picked AS (SELECT .. WHERE status = 'eligible' .. FOR NO KEY UPDATE
    /// SKIP LOCKED) UPDATE .. SET status = 'processing', attempt = attempt + 1,
    /// lease_owner = $4, lease_until = now() + ttl, fence_epoch =
    /// settled_engine.fence_epoch() .. RETURNING key, ROW_FENCE`, committed
    /// on its own (`LoopCtx::lease_one_chunk` in leased.rs).
    ClaimLeased {
        /// The worker.
        worker: u8,
        /// The item.
        item: u8,
    },
    /// Models the check in `LoopCtx::work_and_complete` (leased.rs): a call
    /// slot granted and `LeaseKeeper::is_held` true, so the call is started.
    StartWork {
        /// The worker.
        worker: u8,
    },
    /// Models `LeasedHandler::work_item` = `SettleWithProvider::work_item`
    /// (settlement/leased.rs): `PayoutProvider::pay(payout_key(period, creator),
    /// creator, amount)` at a provider that applies each key once.
    CallProvider {
        /// The worker.
        worker: u8,
        /// How the provider answered.
        answer: Answer,
    },
    /// Models `LoopCtx::complete_once` (leased.rs): `complete_fenced` in
    /// queue/complete.rs, `UPDATE .. SET status = 'settled' .. WHERE key =
    /// f.key AND ROW_FENCE = f.fence AND status = 'processing' RETURNING key`,
    /// then `handler.commit` (`pay_chunk`: ledger rows and balance credits)
    /// for the accepted keys, in one transaction.
    CompleteFenced {
        /// The worker.
        worker: u8,
    },
    /// Models `LoopCtx::record_failure` (leased.rs): `fail_fenced` in
    /// queue/fail.rs, `UPDATE .. SET status = CASE WHEN attempt -
    /// attempt_base >= max THEN 'failed' ELSE 'eligible' END .. WHERE
    /// ROW_FENCE = f.fence AND status = 'processing'`.
    FailFenced {
        /// The worker.
        worker: u8,
    },
    /// Models the abandoned branch of `work_and_complete` (leased.rs): the
    /// lease is not known held, so no call is started and the item is left
    /// to the rescuer.
    Abandon {
        /// The worker.
        worker: u8,
    },
    /// Models `LeaseKeeper::renew` (leased.rs): `renew_leases` in
    /// queue/lease.rs, `UPDATE .. SET lease_until = now() + ttl WHERE key =
    /// f.key AND ROW_FENCE = f.fence AND status = 'processing' AND
    /// lease_owner = $2 RETURNING key`; a lease not returned is dropped.
    RenewLeases {
        /// The worker.
        worker: u8,
    },
    /// The database clock passes the row's `lease_until`.
    LeaseExpires {
        /// The item.
        item: u8,
    },
    /// A worker's own clock passes its lease's deadline (claim sent + ttl),
    /// for a claim the database no longer shows (lost in a failover, or
    /// taken over): `LeaseKeeper::is_held` turns false.
    DeadlinePasses {
        /// The worker.
        worker: u8,
    },
    /// Models `rescue_expired_leases` (rescuer.rs): `rescue_expired` in
    /// queue/fail.rs, `UPDATE .. SET status = CASE WHEN attempt -
    /// attempt_base >= max THEN 'failed' ELSE 'eligible' END .. WHERE
    /// status = 'processing' AND lease_until < now()`.
    RescueExpired {
        /// The item.
        item: u8,
    },
    /// Models the chunk statement's `picked` CTE in queue/statement.rs
    /// (`SELECT .. WHERE status = 'eligible' .. FOR NO KEY UPDATE SKIP
    /// LOCKED`) with its `marked` and effects CTEs, in the open transaction
    /// of `drain_in_transactions` (executor.rs).
    ClaimInTx {
        /// The worker.
        worker: u8,
        /// The item.
        item: u8,
    },
    /// Models the `COMMIT` of an in-transaction chunk (executor.rs):
    /// status `settled`, `attempt + 1` and the effects become visible at once.
    CommitInTx {
        /// The worker.
        worker: u8,
    },
    /// A signal to a worker. SIGKILL: memory lost; an open transaction
    /// rolls back when the connection drops. SIGSTOP, SIGCONT.
    Signal {
        /// The worker.
        worker: u8,
        /// The signal.
        signal: Signal,
    },
    /// The standby replays everything the primary has committed.
    Replicate,
    /// The primary is lost and the standby promoted: what it had not
    /// received is gone; a new timeline; open transactions abort.
    Failover,
}

/// How the provider answered a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Applied now, or the payment under the key was applied before (200 replay).
    Paid,
    /// 503 before anything was applied.
    Unavailable,
    /// Applied, but the answer came after the caller's timeout.
    AppliedThenTimedOut,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::ClaimLeased { worker, item } => write!(f, "w{worker} claim_leased(item {item})"),
            Action::StartWork { worker } => write!(f, "w{worker} is_held: yes, start work_item"),
            Action::CallProvider { worker, answer } => {
                write!(f, "w{worker} work_item: provider pay(key) answers {answer:?}")
            }
            Action::CompleteFenced { worker } => write!(f, "w{worker} complete_fenced + commit (ledger, balance)"),
            Action::FailFenced { worker } => write!(f, "w{worker} fail_fenced (transient)"),
            Action::Abandon { worker } => write!(f, "w{worker} abandons (lease not known held)"),
            Action::RenewLeases { worker } => write!(f, "w{worker} renew_leases"),
            Action::LeaseExpires { item } => write!(f, "database clock passes lease_until of item {item}"),
            Action::DeadlinePasses { worker } => write!(f, "w{worker} own deadline passes (is_held: no)"),
            Action::RescueExpired { item } => write!(f, "rescue_expired_leases (item {item})"),
            Action::ClaimInTx { worker, item } => write!(f, "w{worker} chunk statement locks item {item} (in tx)"),
            Action::CommitInTx { worker } => write!(f, "w{worker} COMMIT chunk"),
            Action::Signal { worker, signal } => write!(f, "w{worker} {signal}"),
            Action::Replicate => write!(f, "standby replays the primary's WAL"),
            Action::Failover => write!(f, "FAILOVER: standby promoted (new timeline)"),
        }
    }
}
