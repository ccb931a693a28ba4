//! The leased-work model: claims, leases on the database clock, renewal,
//! rescue, the fenced completion, the provider call with its idempotency
//! key, and the faults around them (a worker crashed, a worker paused past
//! its lease, a provider that fails or applies and then times out, a
//! failover that loses a suffix of commits and bumps the timeline, a
//! synchronous failover), beside in-transaction claims and a crash in the
//! middle of their transaction.
//!
//! It models `crates/engine/src/leased.rs` (the claim loop and the lease
//! keeper), `queue/claim.rs`, `queue/complete.rs`, `queue/fail.rs`,
//! `queue/lease.rs`, `rescuer.rs`, `fence.rs` and `statement.rs` (in-transaction chunks),
//! with settlement's leased handler (`crates/settled/src/settlement.rs`,
//! `SettleWithProvider`) and its provider (`provider.rs`). A chunk is one
//! item here: every statement is set-based and its conditions are per row.
//!
//! Ghost state (what the world knows, not a column) is marked so: the id of
//! each claim, whether a completion was accepted for a claim that no longer
//! held the row.

use std::fmt;

use stateright::{Model, Property};

use crate::check::Described;

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

/// A fence: `(fence_epoch << 32) | attempt` (`crates/engine/src/fence.rs`).
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
    fn running(&self) -> bool {
        self.up && !self.paused
    }

    fn lease(&self) -> Option<Lease> {
        match self.job {
            Job::Claimed(l) | Job::Working(l) | Job::Called(l, _) => Some(l),
            _ => None,
        }
    }

    fn set_lease(&mut self, lease: Lease) {
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

/// What can happen. Each action names the function and the statement it models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Models `claim_leased` in crates/engine/src/queue/claim.rs: `WITH
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
    /// (settlement.rs): `PayoutProvider::pay(payout_key(period, creator),
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
    /// SIGKILL: memory lost; an open transaction rolls back when the
    /// connection drops.
    Crash {
        /// The worker.
        worker: u8,
    },
    /// SIGSTOP.
    Pause {
        /// The worker.
        worker: u8,
    },
    /// SIGCONT.
    Resume {
        /// The worker.
        worker: u8,
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
            Action::Crash { worker } => write!(f, "w{worker} SIGKILL"),
            Action::Pause { worker } => write!(f, "w{worker} SIGSTOP"),
            Action::Resume { worker } => write!(f, "w{worker} SIGCONT"),
            Action::Replicate => write!(f, "standby replays the primary's WAL"),
            Action::Failover => write!(f, "FAILOVER: standby promoted (new timeline)"),
        }
    }
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

fn amount_of(item: u8) -> u8 {
    item + 1
}

impl LeasedWork {
    /// The bounds `cargo test` checks (leased workers, asynchronous failover).
    pub fn ci() -> LeasedWork {
        LeasedWork {
            items: 1,
            leased_workers: 2,
            tx_workers: 0,
            max_attempts: 2,
            replication: Replication::Asynchronous,
            faults: Faults {
                crashes: 1,
                pauses: 1,
                slow_renewals: 1,
                provider_unavailable: 1,
                applied_then_timed_out: 1,
                failovers: 1,
            },
            guards: Guards::ALL,
        }
    }

    /// The same, with a synchronous standby.
    pub fn ci_synchronous() -> LeasedWork {
        LeasedWork {
            replication: Replication::Synchronous,
            ..LeasedWork::ci()
        }
    }

    /// In-transaction workers beside a leased one (SKIP LOCKED between the
    /// modes; a crash in the middle of a transaction; failover).
    pub fn ci_in_transaction() -> LeasedWork {
        LeasedWork {
            items: 1,
            leased_workers: 1,
            tx_workers: 2,
            max_attempts: 2,
            replication: Replication::Asynchronous,
            faults: Faults {
                crashes: 1,
                pauses: 1,
                slow_renewals: 1,
                provider_unavailable: 0,
                applied_then_timed_out: 1,
                failovers: 1,
            },
            guards: Guards::ALL,
        }
    }

    /// Deeper bounds (`--deep`): three leased workers.
    pub fn deep() -> LeasedWork {
        LeasedWork {
            leased_workers: 3,
            ..LeasedWork::ci()
        }
    }

    /// Deeper bounds: two failovers.
    pub fn deep_two_failovers() -> LeasedWork {
        let mut model = LeasedWork::ci();
        model.faults.failovers = 2;
        model
    }

    /// Deeper bounds: two items (no pauses nor slow renewals).
    pub fn deep_two_items() -> LeasedWork {
        let mut model = LeasedWork::ci();
        model.items = 2;
        model.faults.pauses = 0;
        model.faults.slow_renewals = 0;
        model
    }

    /// Deeper bounds: two leased workers and one in-transaction worker.
    pub fn deep_in_transaction() -> LeasedWork {
        LeasedWork {
            tx_workers: 1,
            ..LeasedWork::ci()
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> LeasedWork {
        self.guards = guards;
        self
    }

    /// `ROW_FENCE = f.fence`, as the guards in force compare it.
    fn fence_holds(&self, row: &Row, fence: Fence) -> bool {
        if !self.guards.fence {
            return true;
        }
        row.attempt == fence.attempt && (!self.guards.timeline || row.fence_epoch == fence.epoch)
    }

    fn all_final(state: &State) -> bool {
        state
            .primary
            .iter()
            .all(|r| matches!(r.status, Status::Settled | Status::Failed))
    }

    fn locked_in_tx(state: &State, item: u8) -> bool {
        state
            .workers
            .iter()
            .any(|w| matches!(w.job, Job::InTx { item: i, .. } if i == item))
    }

    /// True when a running worker holds the row's current claim and
    /// believes its lease valid: only slow renewals let it expire then.
    fn renewed_by_a_running_holder(state: &State, item: u8) -> bool {
        let row = &state.primary[item as usize];
        state.workers.iter().any(|w| {
            w.running()
                && w.lease()
                    .is_some_and(|l| l.item == item && Some(l.claim) == row.claim && l.held)
        })
    }

    fn commit(&self, state: &mut State) {
        if self.replication == Replication::Synchronous {
            state.standby = state.primary.clone();
        }
    }

    fn worker_actions(&self, state: &State, w: u8, actions: &mut Vec<Action>) {
        let worker = &state.workers[w as usize];
        if !worker.running() {
            return;
        }
        match worker.job {
            Job::Idle => {
                for item in 0..self.items {
                    let row = &state.primary[item as usize];
                    if row.status == Status::Eligible && !Self::locked_in_tx(state, item) {
                        actions.push(if worker.in_tx {
                            Action::ClaimInTx { worker: w, item }
                        } else {
                            Action::ClaimLeased { worker: w, item }
                        });
                    }
                }
            }
            Job::Claimed(lease) if lease.held => actions.push(Action::StartWork { worker: w }),
            Job::Claimed(_) => actions.push(Action::Abandon { worker: w }),
            Job::Working(_) => {
                actions.push(Action::CallProvider {
                    worker: w,
                    answer: Answer::Paid,
                });
                if state.budget.provider_unavailable > 0 {
                    actions.push(Action::CallProvider {
                        worker: w,
                        answer: Answer::Unavailable,
                    });
                }
                if state.budget.applied_then_timed_out > 0 {
                    actions.push(Action::CallProvider {
                        worker: w,
                        answer: Answer::AppliedThenTimedOut,
                    });
                }
            }
            Job::Called(_, true) => actions.push(Action::CompleteFenced { worker: w }),
            Job::Called(_, false) => actions.push(Action::FailFenced { worker: w }),
            Job::InTx { .. } => actions.push(Action::CommitInTx { worker: w }),
        }
        if let Some(lease) = worker.lease() {
            let (ours, row_live) = self.renewal_finds(state, w, lease);
            if (ours && (!row_live || !lease.held)) || (!ours && lease.held) {
                actions.push(Action::RenewLeases { worker: w });
            }
        }
    }

    /// What `renew_leases` finds for a lease: still ours, and the row's lease live.
    fn renewal_finds(&self, state: &State, w: u8, lease: Lease) -> (bool, bool) {
        let row = &state.primary[lease.item as usize];
        let ours = row.status == Status::Processing && self.fence_holds(row, lease.fence) && row.lease_owner == Some(w);
        (ours, row.lease_live)
    }

    fn fault_actions(&self, state: &State, actions: &mut Vec<Action>) {
        let busy = !Self::all_final(state);
        for (w, worker) in state.workers.iter().enumerate() {
            let w = w as u8;
            if worker.up && busy && state.budget.crashes > 0 {
                actions.push(Action::Crash { worker: w });
            }
            if worker.running() && busy && state.budget.pauses > 0 {
                actions.push(Action::Pause { worker: w });
            }
            if worker.up && worker.paused {
                actions.push(Action::Resume { worker: w });
            }
            if let Some(lease) = worker.lease() {
                let row = &state.primary[lease.item as usize];
                let current = row.status == Status::Processing && row.claim == Some(lease.claim);
                if lease.held && !current {
                    actions.push(Action::DeadlinePasses { worker: w });
                }
            }
        }
        for item in 0..self.items {
            let row = &state.primary[item as usize];
            let expirable = !Self::renewed_by_a_running_holder(state, item) || state.budget.slow_renewals > 0;
            if row.status == Status::Processing && row.lease_live && expirable {
                actions.push(Action::LeaseExpires { item });
            }
            if row.status == Status::Processing && !row.lease_live {
                actions.push(Action::RescueExpired { item });
            }
        }
        if self.replication == Replication::Asynchronous && state.standby != state.primary {
            actions.push(Action::Replicate);
        }
        if state.budget.failovers > 0 {
            actions.push(Action::Failover);
        }
    }

    fn claim_leased(&self, s: &mut State, w: u8, item: u8) {
        let timeline = s.timeline;
        let claim = s.claims;
        s.claims += 1;
        let row = &mut s.primary[item as usize];
        row.status = Status::Processing;
        row.attempt += 1;
        row.fence_epoch = timeline;
        row.lease_owner = Some(w);
        row.lease_live = true;
        row.claim = Some(claim);
        let fence = Fence {
            epoch: timeline,
            attempt: row.attempt,
        };
        let twice = s.workers.iter().any(|o| {
            o.lease()
                .is_some_and(|l| l.item == item && l.fence.attempt == fence.attempt && l.fence.epoch != fence.epoch)
        });
        s.attempt_handed_out_twice |= twice;
        s.workers[w as usize].job = Job::Claimed(Lease {
            item,
            fence,
            claim,
            held: true,
        });
        self.commit(s);
    }

    fn call_provider(&self, s: &mut State, w: u8, answer: Answer) {
        let Job::Working(lease) = s.workers[w as usize].job else {
            unreachable!("a call is sent from Working")
        };
        let payment = Payment {
            item: lease.item,
            claim: (!self.guards.idempotency_key).then_some(lease.claim),
            amount: amount_of(lease.item),
        };
        match answer {
            Answer::Unavailable => s.budget.provider_unavailable -= 1,
            Answer::AppliedThenTimedOut => s.budget.applied_then_timed_out -= 1,
            Answer::Paid => {}
        }
        let applied = answer != Answer::Unavailable;
        let same_key = |p: &Payment| p.item == payment.item && p.claim == payment.claim;
        if applied && !s.payments.iter().any(same_key) {
            s.payments.push(payment);
            s.payments.sort();
        }
        s.workers[w as usize].job = Job::Called(lease, answer == Answer::Paid);
    }

    fn complete_fenced(&self, s: &mut State, w: u8) {
        let Job::Called(lease, true) = s.workers[w as usize].job else {
            unreachable!("a completion follows a paid call")
        };
        let row = &mut s.primary[lease.item as usize];
        let accepted = row.status == Status::Processing && self.fence_holds(row, lease.fence);
        let stale = row.claim != Some(lease.claim) || row.status != Status::Processing;
        if accepted {
            row.status = Status::Settled;
            row.lease_owner = None;
            row.lease_live = false;
            row.effects += 1;
            row.settled_by = Some(lease.claim);
            s.stale_completion_accepted |= stale;
        } else {
            s.stale_completion_refused |= stale;
        }
        s.workers[w as usize].job = Job::Idle;
        self.commit(s);
    }

    fn fail_fenced(&self, s: &mut State, w: u8) {
        let Job::Called(lease, false) = s.workers[w as usize].job else {
            unreachable!("a failure follows a failed call")
        };
        let max = self.max_attempts;
        let row = &mut s.primary[lease.item as usize];
        if row.status == Status::Processing && self.fence_holds(row, lease.fence) {
            row.status = if row.attempt >= max {
                Status::Failed
            } else {
                Status::Eligible
            };
            row.lease_owner = None;
            row.lease_live = false;
        }
        s.workers[w as usize].job = Job::Idle;
        self.commit(s);
    }

    fn renew(&self, s: &mut State, w: u8) {
        let lease = s.workers[w as usize].lease().expect("renewal of a held lease");
        let (ours, _) = self.renewal_finds(s, w, lease);
        if ours {
            s.primary[lease.item as usize].lease_live = true;
            self.commit(s);
        }
        s.workers[w as usize].set_lease(Lease { held: ours, ..lease });
    }

    fn lease_expires(&self, s: &mut State, item: u8) {
        if Self::renewed_by_a_running_holder(s, item) {
            s.budget.slow_renewals -= 1;
        }
        let claim = s.primary[item as usize].claim;
        s.primary[item as usize].lease_live = false;
        // The worker's deadline (claim or renewal sent + ttl) is never later
        // than the row's lease_until.
        for worker in &mut s.workers {
            if let Some(lease) = worker.lease().filter(|l| l.item == item && Some(l.claim) == claim) {
                worker.set_lease(Lease { held: false, ..lease });
            }
        }
    }

    fn rescue(&self, s: &mut State, item: u8) {
        let max = self.max_attempts;
        let row = &mut s.primary[item as usize];
        row.status = if row.attempt >= max {
            Status::Failed
        } else {
            Status::Eligible
        };
        row.lease_owner = None;
        self.commit(s);
    }

    fn failover(&self, s: &mut State) {
        s.budget.failovers -= 1;
        if self.replication == Replication::Asynchronous {
            s.primary = s.standby.clone();
        }
        s.timeline += 1;
        for worker in &mut s.workers {
            if matches!(worker.job, Job::InTx { .. }) {
                worker.job = Job::Idle;
            }
        }
    }
}

impl Model for LeasedWork {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let row = Row {
            status: Status::Eligible,
            attempt: 0,
            fence_epoch: 0,
            lease_owner: None,
            lease_live: false,
            effects: 0,
            claim: None,
            settled_by: None,
        };
        let rows = vec![row; self.items as usize];
        let worker = |in_tx| Worker {
            up: true,
            paused: false,
            in_tx,
            job: Job::Idle,
        };
        let workers = (0..self.leased_workers)
            .map(|_| worker(false))
            .chain((0..self.tx_workers).map(|_| worker(true)))
            .collect();
        vec![State {
            primary: rows.clone(),
            standby: rows,
            timeline: 1,
            workers,
            payments: Vec::new(),
            budget: self.faults,
            claims: 0,
            stale_completion_accepted: false,
            stale_completion_refused: false,
            attempt_handed_out_twice: false,
            tx_crashed: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for w in 0..state.workers.len() as u8 {
            self.worker_actions(state, w, actions);
        }
        self.fault_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::ClaimLeased { worker, item } => self.claim_leased(&mut s, worker, item),
            Action::StartWork { worker } => {
                let lease = s.workers[worker as usize].lease().expect("claimed");
                s.workers[worker as usize].job = Job::Working(lease);
            }
            Action::CallProvider { worker, answer } => self.call_provider(&mut s, worker, answer),
            Action::CompleteFenced { worker } => self.complete_fenced(&mut s, worker),
            Action::FailFenced { worker } => self.fail_fenced(&mut s, worker),
            Action::Abandon { worker } => s.workers[worker as usize].job = Job::Idle,
            Action::RenewLeases { worker } => self.renew(&mut s, worker),
            Action::LeaseExpires { item } => self.lease_expires(&mut s, item),
            Action::DeadlinePasses { worker } => {
                let lease = s.workers[worker as usize].lease().expect("a lease");
                s.workers[worker as usize].set_lease(Lease { held: false, ..lease });
            }
            Action::RescueExpired { item } => self.rescue(&mut s, item),
            Action::ClaimInTx { worker, item } => {
                let claim = s.claims;
                s.claims += 1;
                let fence = Fence {
                    epoch: 0,
                    attempt: s.primary[item as usize].attempt + 1,
                };
                s.workers[worker as usize].job = Job::InTx { item, fence, claim };
            }
            Action::CommitInTx { worker } => {
                let Job::InTx { item, fence, claim } = s.workers[worker as usize].job else {
                    unreachable!("a commit ends a transaction")
                };
                let row = &mut s.primary[item as usize];
                row.claim = Some(claim);
                row.settled_by = Some(claim);
                row.status = Status::Settled;
                row.attempt = fence.attempt;
                row.effects += 1;
                s.workers[worker as usize].job = Job::Idle;
                self.commit(&mut s);
            }
            Action::Crash { worker } => {
                s.budget.crashes -= 1;
                s.tx_crashed |= matches!(s.workers[worker as usize].job, Job::InTx { .. });
                let w = &mut s.workers[worker as usize];
                w.up = false;
                w.paused = false;
                w.job = Job::Idle;
            }
            Action::Pause { worker } => {
                s.budget.pauses -= 1;
                s.workers[worker as usize].paused = true;
            }
            Action::Resume { worker } => s.workers[worker as usize].paused = false,
            Action::Replicate => s.standby = s.primary.clone(),
            Action::Failover => self.failover(&mut s),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(property::EFFECT_AT_MOST_ONCE, |_, s: &State| {
                s.primary.iter().all(|r| r.effects <= 1)
            }),
            Property::always(property::EFFECT_WITH_STATUS, |_, s: &State| {
                s.primary
                    .iter()
                    .all(|r| (r.effects > 0) == (r.status == Status::Settled))
            }),
            Property::always(property::NO_STALE_COMPLETION, |_, s: &State| {
                !s.stale_completion_accepted
            }),
            Property::always(property::PAID_AT_MOST_ONCE, |m: &LeasedWork, s: &State| {
                (0..m.items).all(|item| s.payments.iter().filter(|p| p.item == item).count() <= 1)
            }),
            Property::always(property::KEY_ONCE_WITH_AMOUNT, |_, s: &State| {
                s.payments.iter().all(|p| p.amount == amount_of(p.item))
                    && s.payments
                        .windows(2)
                        .all(|w| (w[0].item, w[0].claim) != (w[1].item, w[1].claim))
            }),
            Property::eventually(property::EVERY_ITEM_FINAL, |_, s: &State| Self::all_final(s)),
            // Examples the bounds must reach, or the model says nothing.
            Property::sometimes("an item is settled", |_, s: &State| {
                s.primary.iter().any(|r| r.status == Status::Settled)
            }),
            Property::sometimes("an item fails after its attempts", |_, s: &State| {
                s.primary.iter().any(|r| r.status == Status::Failed)
            }),
        ];
        if self.leased_workers >= 2 {
            properties.push(Property::sometimes(
                "a zombie's completion is refused",
                |_, s: &State| s.stale_completion_refused,
            ));
        }
        if self.leased_workers >= 2 && self.faults.failovers > 0 && self.replication == Replication::Asynchronous {
            properties.push(Property::sometimes(
                "a failover hands out a lost claim's attempt again",
                |_, s: &State| s.attempt_handed_out_twice,
            ));
        }
        if self.tx_workers > 0 && self.faults.crashes > 0 {
            properties.push(Property::sometimes(
                "a worker dies in the middle of its transaction",
                |_, s: &State| s.tx_crashed,
            ));
        }
        properties
    }
}

impl Described for LeasedWork {
    fn name(&self) -> String {
        let mut guards = Vec::new();
        if !self.guards.fence {
            guards.push("no fence");
        }
        if !self.guards.timeline {
            guards.push("no timeline in the fence");
        }
        if !self.guards.idempotency_key {
            guards.push("no idempotency key");
        }
        let guards = if guards.is_empty() {
            String::new()
        } else {
            format!(", {}", guards.join(", "))
        };
        let f = self.faults;
        format!(
            "leased work ({} item(s), {} leased + {} in-tx workers, {:?} replication, max attempts {}; \
             faults: {} crash, {} pause, {} slow renewal, {} 503, {} applied-then-timed-out, {} failover{guards})",
            self.items,
            self.leased_workers,
            self.tx_workers,
            self.replication,
            self.max_attempts,
            f.crashes,
            f.pauses,
            f.slow_renewals,
            f.provider_unavailable,
            f.applied_then_timed_out,
            f.failovers
        )
    }

    fn describe(&self, s: &State) -> String {
        let rows: Vec<String> = s.primary.iter().map(describe_row).collect();
        let workers: Vec<String> = s
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| format!("w{i} {}", describe_worker(w)))
            .collect();
        let mut out = format!("primary tl{} [{}]", s.timeline, rows.join(", "));
        if s.standby != s.primary {
            let standby: Vec<String> = s.standby.iter().map(describe_row).collect();
            out.push_str(&format!(" standby [{}]", standby.join(", ")));
        }
        let paid: Vec<String> = s
            .payments
            .iter()
            .map(|p| match p.claim {
                Some(c) => format!("item{}/claim{}", p.item, c),
                None => format!("item{}", p.item),
            })
            .collect();
        out.push_str(&format!(
            " | {} | provider paid [{}]",
            workers.join(", "),
            paid.join(", ")
        ));
        out
    }
}

fn describe_row(r: &Row) -> String {
    let status = match r.status {
        Status::Eligible => "eligible",
        Status::Processing => "processing",
        Status::Settled => "settled",
        Status::Failed => "failed",
    };
    let mut out = format!("{status} {}@{}", r.attempt, r.fence_epoch);
    if r.status == Status::Processing {
        let owner = r.lease_owner.map_or("-".to_string(), |o| format!("w{o}"));
        let live = if r.lease_live { "live" } else { "expired" };
        out.push_str(&format!(" lease {owner} {live}"));
    }
    if let Some(c) = r.claim {
        out.push_str(&format!(" claim{c}"));
    }
    if let Some(c) = r.settled_by {
        out.push_str(&format!(" settled by claim{c}"));
    }
    if r.effects > 0 {
        out.push_str(&format!(" ledger x{}", r.effects));
    }
    out
}

fn describe_worker(w: &Worker) -> String {
    if !w.up {
        return "down".into();
    }
    let lease = |l: &Lease| {
        format!(
            "item{} {} claim{}{}",
            l.item,
            l.fence,
            l.claim,
            if l.held { " held" } else { " not held" }
        )
    };
    let job = match &w.job {
        Job::Idle => "idle".to_string(),
        Job::Claimed(l) => format!("claimed {}", lease(l)),
        Job::Working(l) => format!("calling {}", lease(l)),
        Job::Called(l, ok) => format!("{} {}", if *ok { "paid" } else { "call failed" }, lease(l)),
        Job::InTx { item, fence, .. } => format!("in tx item{item} {fence}"),
    };
    if w.paused {
        format!("{job} (stopped)")
    } else {
        job
    }
}
