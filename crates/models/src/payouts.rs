//! The payouts model: the protocol issue 26 specifies. It is not built
//! yet (today `POST /v1/payouts` debits and stores a `completed` row, in
//! crates/settled/src/api/payouts.rs), so the actions name the operations
//! the issue defines, and this model is the protocol's first check.
//!
//! What it holds: a creator's balance; payouts through their states
//! (created, queued, sent, paid, failed, cancelled, expired); the debit, the
//! payout row and its delivery job committed in one transaction (the
//! outbox); delivery in leased mode on a continuous queue, with a key
//! derived from the payout's id, crashes and paused zombies rescued; a
//! provider that accepts a payment as pending and later pays or fails it,
//! answers 503, applies and then times out, or refuses; its webhooks
//! duplicated, reordered and lost; polling of payouts that stay sent;
//! confirmation tokens redeemed by racing requests and expiring; funds
//! returned in the same transaction as the transition that fails, cancels
//! or expires a payout.
//!
//! Every transition of a payout is a conditional update on its current
//! state (`UPDATE settlement.payouts SET state = $to WHERE id = $1 AND
//! state = ANY($from)`). Without that guard (a variant), the application
//! reads the state, decides, and writes it blind: the model then splits
//! each transition into its read and its write. With the guard the read
//! decides nothing, so the two are one step.

use std::fmt;

use stateright::{Model, Property};

use crate::check::Described;

/// Faults and racing requests, each at most this many times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A delivery worker killed (it stays down).
    pub crashes: u8,
    /// A delivery worker paused past its lease (a zombie when it wakes).
    pub pauses: u8,
    /// The provider answering 503 before applying anything.
    pub provider_unavailable: u8,
    /// The provider applying the payment, then the caller timing out.
    pub applied_then_timed_out: u8,
    /// The provider refusing a payment (4xx).
    pub refusals: u8,
    /// A payment the provider accepted failing later (`payment.failed`).
    pub provider_failures: u8,
    /// A webhook delivered once more.
    pub webhook_duplicates: u8,
    /// A webhook never delivered.
    pub webhook_losses: u8,
    /// Requests redeeming a payout's confirmation token (racing ones too).
    pub redemptions: u8,
    /// A creator cancelling an unconfirmed payout.
    pub cancels: u8,
}

/// The guards a variant may go without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guards {
    /// Each transition is a conditional update on the payout's state.
    pub state_condition: bool,
    /// Each webhook's event id is stored under a unique key; a repeat is
    /// answered 200 and applied no more.
    pub event_id: bool,
    /// The provider's idempotency key is derived from the payout's id.
    /// Without it, each delivery attempt sends a key of its own.
    pub idempotency_key: bool,
}

impl Guards {
    /// Every guard the protocol has.
    pub const ALL: Guards = Guards {
        state_condition: true,
        event_id: true,
        idempotency_key: true,
    };
}

/// The payouts model at some bounds.
#[derive(Debug, Clone)]
pub struct Payouts {
    /// Payout requests (each of one unit), made in order.
    pub payouts: u8,
    /// The creator's balance before them (settled rewards).
    pub credit: i8,
    /// Payouts are created with `"confirm": true` (a token to redeem).
    pub confirm: bool,
    /// Delivery workers.
    pub workers: u8,
    /// Faults and races.
    pub faults: Faults,
    /// The guards in force.
    pub guards: Guards,
}

/// `settlement.payouts.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayoutState {
    /// `created`: awaiting confirmation.
    Created,
    /// `queued`: its delivery job is on the queue.
    Queued,
    /// `sent`: the provider accepted it (pending).
    Sent,
    /// `paid`
    Paid,
    /// `failed` (funds returned)
    Failed,
    /// `cancelled` (funds returned)
    Cancelled,
    /// `expired` (funds returned)
    Expired,
}

impl PayoutState {
    fn returns_funds(self) -> bool {
        matches!(
            self,
            PayoutState::Failed | PayoutState::Cancelled | PayoutState::Expired
        )
    }

    /// The states a transition to `self` may start from (the `$from` of
    /// its conditional update).
    fn allowed_from(self) -> &'static [PayoutState] {
        use PayoutState::*;
        match self {
            Created => &[],
            Queued => &[Created],
            Sent => &[Queued],
            Paid | Failed => &[Queued, Sent],
            Cancelled | Expired => &[Created],
        }
    }
}

/// A payout request's row, if it made one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// Not requested yet.
    NotRequested,
    /// Refused: insufficient funds (nothing written).
    Refused,
    /// A row of `settlement.payouts`.
    Row(PayoutRow),
}

/// A row of `settlement.payouts`, with what its transitions wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayoutRow {
    /// `state`
    pub state: PayoutState,
    /// `expires_at < now()`: the confirmation token has expired.
    pub token_expired: bool,
    /// Ledger entries that gave its amount back to the balance.
    pub returned: u8,
    /// Ghost: successful redemptions of its token.
    pub confirmed: u8,
}

/// A delivery job's `status` on the continuous queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobStatus {
    /// `eligible`
    Eligible,
    /// `processing` (leased)
    Processing,
    /// `settled`: delivered.
    Done,
}

/// A delivery job (a row of the continuous queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobRow {
    /// The payout it delivers.
    pub payout: u8,
    /// `status`
    pub status: JobStatus,
    /// `attempt` (the fence).
    pub attempt: u8,
    /// `lease_until > now()`.
    pub lease_live: bool,
}

/// A payment at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Payment {
    /// The payout it pays.
    pub payout: u8,
    /// The delivery attempt, when each attempt sends a key of its own.
    pub attempt: Option<u8>,
    /// Its status at the provider.
    pub status: ProviderStatus,
}

/// A payment's status at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProviderStatus {
    /// Accepted, not paid yet.
    Pending,
    /// Paid: the money left.
    Paid,
    /// Failed after acceptance: no money left.
    Failed,
    /// Refused at creation: no money left.
    Refused,
}

/// What a delivery worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Between jobs.
    Idle,
    /// The job is claimed (its payout read as `seen`).
    Claimed {
        /// The job.
        job: u8,
        /// The fence.
        attempt: u8,
        /// The payout's state as loaded.
        seen: PayoutState,
    },
    /// The provider answered.
    Called {
        /// The job.
        job: u8,
        /// The fence.
        attempt: u8,
        /// The payout's state as loaded.
        seen: PayoutState,
        /// The answer (None: a transient error).
        answer: Option<ProviderStatus>,
    },
}

/// A delivery worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Worker {
    /// Alive.
    pub up: bool,
    /// Stopped.
    pub paused: bool,
    /// What it does.
    pub job: Delivery,
}

/// Who wants to move a payout (between its read and its write, when the
/// update is not conditional).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// `POST /v1/provider-events` with this event.
    Webhook(u8),
    /// The poller.
    Poll,
    /// `POST /v1/payouts/{id}/confirm`.
    Confirm,
    /// The sweeper of unconfirmed payouts.
    Sweeper,
    /// A delivery worker's completion.
    Delivery,
    /// The creator's cancel.
    Creator,
}

/// A transition read and decided, not yet written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Intent {
    /// The payout.
    pub payout: u8,
    /// Where to.
    pub to: PayoutStateKey,
    /// Who.
    pub source: Source,
}

/// [`PayoutState`] with an order, for sorting intents.
pub type PayoutStateKey = u8;

fn key_of(state: PayoutState) -> PayoutStateKey {
    state as u8
}

fn state_of(key: PayoutStateKey) -> PayoutState {
    use PayoutState::*;
    [Created, Queued, Sent, Paid, Failed, Cancelled, Expired][key as usize]
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// `settlement.creator_balance.balance`.
    pub balance: i8,
    /// The payout requests and their rows.
    pub payouts: Vec<Slot>,
    /// The delivery jobs.
    pub jobs: Vec<JobRow>,
    /// Payments at the provider (an event id is a payment's index).
    pub payments: Vec<Payment>,
    /// Webhook deliveries in flight (event ids, sorted: any order).
    pub inflight: Vec<u8>,
    /// `settlement.provider_events`: how many times each event id was stored.
    pub events: Vec<u8>,
    /// Transitions read and decided, not yet written.
    pub intents: Vec<Intent>,
    /// The delivery workers.
    pub workers: Vec<Worker>,
    /// Faults left.
    pub budget: Faults,
}

/// What can happen. Each action names the operation issue 26 defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `POST /v1/payouts`: one transaction: the conditional debit (`UPDATE
    /// creator_balance SET balance = balance - $2 WHERE creator = $1 AND
    /// balance >= $2`), the payout row (`created` with `confirm`, else
    /// `queued`) and, when queued, its delivery job (the outbox).
    CreatePayout {
        /// The payout.
        payout: u8,
    },
    /// `POST /v1/payouts/{id}/confirm`: `UPDATE payouts SET state =
    /// 'queued' WHERE id = $1 AND state = 'created' AND token = $2 AND
    /// expires_at > now()` and the delivery job, one transaction.
    Redeem {
        /// The payout.
        payout: u8,
    },
    /// The database clock passes the token's `expires_at`.
    TokenExpires {
        /// The payout.
        payout: u8,
    },
    /// The sweeper: `UPDATE payouts SET state = 'expired' WHERE state =
    /// 'created' AND expires_at < now()` and the return, one transaction.
    Expire {
        /// The payout.
        payout: u8,
    },
    /// The creator cancels an unconfirmed payout: `created` to `cancelled`
    /// and the return, one transaction.
    Cancel {
        /// The payout.
        payout: u8,
    },
    /// A delivery worker's `claim_leased` of a job (attempt + 1), and the
    /// payout loaded by `prepare`.
    ClaimJob {
        /// The worker.
        worker: u8,
        /// The job.
        job: u8,
    },
    /// `work_item`: `POST /v1/payments` with `Idempotency-Key` derived from
    /// the payout's id.
    CallProvider {
        /// The worker.
        worker: u8,
        /// What the provider does.
        answer: Answer,
    },
    /// The completion: `complete_fenced` of the job and the payout's
    /// transition from the answer (`pending`: sent; `paid`; `failed` or a
    /// refusal: failed and returned), one transaction.
    RecordDelivery {
        /// The worker.
        worker: u8,
    },
    /// A transient answer: `fail_fenced`, the job eligible again after a
    /// backoff (no attempt is spent while the provider is down).
    RetryLater {
        /// The worker.
        worker: u8,
    },
    /// The database clock passes a job's `lease_until` (its worker is down
    /// or stopped).
    LeaseExpires {
        /// The job.
        job: u8,
    },
    /// `rescue_expired_leases`: the job eligible again.
    Rescue {
        /// The job.
        job: u8,
    },
    /// The provider pays or fails a pending payment, and sends its webhook.
    ProviderSettles {
        /// The payment (and event id).
        payment: u8,
        /// Paid (else failed).
        paid: bool,
    },
    /// The network delivers a webhook once more.
    DuplicateWebhook {
        /// The event.
        event: u8,
    },
    /// The network loses a webhook.
    LoseWebhook {
        /// The event.
        event: u8,
    },
    /// `POST /v1/provider-events`: the signature checked, the event stored
    /// (`INSERT INTO provider_events (id, ..) ON CONFLICT (id) DO NOTHING`)
    /// and applied, one transaction. Without the conditional update, this
    /// is its read.
    ReceiveWebhook {
        /// The event.
        event: u8,
    },
    /// The poller: a payout still `sent` past its deadline is looked up
    /// (`GET /v1/payments?idempotency_key=K`) and moved to the provider's
    /// final status. Without the conditional update, this is its read.
    Poll {
        /// The payout.
        payout: u8,
    },
    /// Without the conditional update: the blind write of a transition
    /// read before (`UPDATE payouts SET state = $to WHERE id = $1`, and the
    /// return or the delivery job with it).
    Write {
        /// The intent.
        intent: Intent,
    },
    /// A delivery worker killed.
    Crash {
        /// The worker.
        worker: u8,
    },
    /// A delivery worker stopped.
    Pause {
        /// The worker.
        worker: u8,
    },
    /// A delivery worker continued.
    Resume {
        /// The worker.
        worker: u8,
    },
}

/// How the provider answers a create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// 201 or a 200 replay, with the payment's current status.
    Accepted,
    /// 503 before anything was applied.
    Unavailable,
    /// Applied as pending; the answer came too late.
    AppliedThenTimedOut,
    /// A 4xx refusal (stored under the key: a repeat is refused again).
    Refused,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::CreatePayout { payout } => write!(f, "POST /v1/payouts (payout {payout}: debit, row, job)"),
            Action::Redeem { payout } => write!(f, "POST /v1/payouts/{payout}/confirm"),
            Action::TokenExpires { payout } => write!(f, "clock passes payout {payout}'s token expires_at"),
            Action::Expire { payout } => write!(f, "sweeper expires payout {payout}"),
            Action::Cancel { payout } => write!(f, "creator cancels payout {payout}"),
            Action::ClaimJob { worker, job } => write!(f, "w{worker} claims delivery job {job}"),
            Action::CallProvider { worker, answer } => write!(f, "w{worker} POST /v1/payments: {answer:?}"),
            Action::RecordDelivery { worker } => write!(f, "w{worker} records the answer (fenced completion)"),
            Action::RetryLater { worker } => write!(f, "w{worker} fail_fenced: retry later"),
            Action::LeaseExpires { job } => write!(f, "clock passes job {job}'s lease_until"),
            Action::Rescue { job } => write!(f, "rescue_expired_leases (job {job})"),
            Action::ProviderSettles { payment, paid } => {
                let outcome = if paid { "paid" } else { "failed" };
                write!(f, "provider: payment {payment} {outcome}, webhook e{payment} sent")
            }
            Action::DuplicateWebhook { event } => write!(f, "network duplicates webhook e{event}"),
            Action::LoseWebhook { event } => write!(f, "network loses webhook e{event}"),
            Action::ReceiveWebhook { event } => write!(f, "POST /v1/provider-events (e{event})"),
            Action::Poll { payout } => write!(f, "poller looks up payout {payout}"),
            Action::Write { intent } => write!(
                f,
                "{:?} writes payout {} {:?} (blind)",
                intent.source,
                intent.payout,
                state_of(intent.to)
            ),
            Action::Crash { worker } => write!(f, "w{worker} SIGKILL"),
            Action::Pause { worker } => write!(f, "w{worker} SIGSTOP"),
            Action::Resume { worker } => write!(f, "w{worker} SIGCONT"),
        }
    }
}

/// Property names.
pub mod property {
    /// Safety.
    pub const BALANCE_NOT_NEGATIVE: &str = "a balance never goes negative";
    /// Safety.
    pub const MONEY_CONSERVED: &str = "credits = balance + payouts not returned";
    /// Safety.
    pub const RETURNED_AT_MOST_ONCE: &str = "funds are returned at most once";
    /// Safety.
    pub const RETURNED_ONLY_UNPAID: &str = "funds are returned only for a payout that did not pay";
    /// Safety.
    pub const PAID_AT_MOST_ONCE: &str = "the provider pays each payout at most once";
    /// Safety.
    pub const EVENT_AT_MOST_ONCE: &str = "each provider event is applied at most once";
    /// Safety.
    pub const TOKEN_ONCE: &str = "a confirmation token is redeemed at most once";
    /// Liveness.
    pub const EVERY_PAYOUT_ENDS: &str = "every payout ends paid or returned";
}

impl Payouts {
    /// Bounds `cargo test` checks: one payout with a confirmation token.
    pub fn ci_confirmed() -> Payouts {
        Payouts {
            payouts: 1,
            credit: 1,
            confirm: true,
            workers: 2,
            faults: Faults {
                crashes: 1,
                pauses: 1,
                provider_unavailable: 1,
                applied_then_timed_out: 1,
                refusals: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                redemptions: 2,
                cancels: 1,
            },
            guards: Guards::ALL,
        }
    }

    /// Bounds `cargo test` checks: two payouts on a balance for one.
    pub fn ci_two_payouts() -> Payouts {
        Payouts {
            payouts: 2,
            credit: 1,
            confirm: false,
            workers: 2,
            faults: Faults {
                crashes: 1,
                pauses: 0,
                provider_unavailable: 0,
                applied_then_timed_out: 1,
                refusals: 0,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                redemptions: 0,
                cancels: 0,
            },
            guards: Guards::ALL,
        }
    }

    /// Deeper bounds (`--deep`): two confirmed payouts on a balance for both.
    pub fn deep_confirmed() -> Payouts {
        Payouts {
            payouts: 2,
            credit: 2,
            ..Payouts::ci_confirmed()
        }
    }

    /// Deeper bounds: two payouts on a balance for one, every fault.
    pub fn deep_two_payouts() -> Payouts {
        Payouts {
            payouts: 2,
            credit: 1,
            confirm: false,
            workers: 2,
            faults: Faults {
                crashes: 1,
                pauses: 1,
                provider_unavailable: 1,
                applied_then_timed_out: 1,
                refusals: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                redemptions: 0,
                cancels: 0,
            },
            guards: Guards::ALL,
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> Payouts {
        self.guards = guards;
        self
    }

    fn row(state: &State, payout: u8) -> Option<PayoutRow> {
        match state.payouts[payout as usize] {
            Slot::Row(row) => Some(row),
            _ => None,
        }
    }

    fn row_mut(state: &mut State, payout: u8) -> &mut PayoutRow {
        match &mut state.payouts[payout as usize] {
            Slot::Row(row) => row,
            _ => unreachable!("payout {payout} has a row"),
        }
    }

    /// The provider's payment for a payout's key (the latest, when each
    /// attempt has a key of its own).
    fn payment_of(state: &State, payout: u8) -> Option<(usize, Payment)> {
        state
            .payments
            .iter()
            .enumerate()
            .rfind(|(_, p)| p.payout == payout)
            .map(|(i, p)| (i, *p))
    }

    /// Whether a transition may be taken from the state the writer knows:
    /// the current one under the conditional update, else the one it read.
    fn may_move(row: PayoutRow, to: PayoutState) -> bool {
        to.allowed_from().contains(&row.state)
    }

    /// A transition and what commits with it: the return of the funds, or
    /// the delivery job. With the guard, only from an allowed state.
    fn transition(&self, s: &mut State, payout: u8, to: PayoutState, source: Source) -> bool {
        let row = Self::row(s, payout).expect("a payout row");
        if self.guards.state_condition && !Self::may_move(row, to) {
            return false;
        }
        let row = Self::row_mut(s, payout);
        row.state = to;
        if to.returns_funds() {
            row.returned += 1;
        }
        if source == Source::Confirm {
            row.confirmed += 1;
        }
        if to.returns_funds() {
            s.balance += 1;
        }
        if to == PayoutState::Queued {
            s.jobs.push(JobRow {
                payout,
                status: JobStatus::Eligible,
                attempt: 0,
                lease_live: false,
            });
        }
        true
    }

    /// Moves a payout now (conditional update), or records the intent to
    /// (read, decided; the blind write comes later).
    fn decide(&self, s: &mut State, payout: u8, to: PayoutState, source: Source) {
        if self.guards.state_condition {
            self.transition(s, payout, to, source);
        } else {
            let row = Self::row(s, payout).expect("a payout row");
            if Self::may_move(row, to) {
                s.intents.push(Intent {
                    payout,
                    to: key_of(to),
                    source,
                });
                s.intents.sort();
            }
        }
    }

    /// A source may read again only once its earlier read is written.
    fn reading(state: &State, payout: u8, source: Source) -> bool {
        state.intents.iter().any(|i| i.payout == payout && i.source == source)
    }

    fn payout_actions(&self, state: &State, actions: &mut Vec<Action>) {
        if let Some(next) = state.payouts.iter().position(|p| *p == Slot::NotRequested) {
            actions.push(Action::CreatePayout { payout: next as u8 });
        }
        for p in 0..self.payouts {
            let Some(row) = Self::row(state, p) else { continue };
            let readable = |source| self.guards.state_condition || !Self::reading(state, p, source);
            if row.state == PayoutState::Created {
                if !row.token_expired {
                    if state.budget.redemptions > 0 {
                        actions.push(Action::Redeem { payout: p });
                    }
                    actions.push(Action::TokenExpires { payout: p });
                } else if readable(Source::Sweeper) {
                    actions.push(Action::Expire { payout: p });
                }
                if state.budget.cancels > 0 {
                    actions.push(Action::Cancel { payout: p });
                }
            }
            let final_at_provider = Self::payment_of(state, p)
                .is_some_and(|(_, pay)| matches!(pay.status, ProviderStatus::Paid | ProviderStatus::Failed));
            if row.state == PayoutState::Sent && final_at_provider && readable(Source::Poll) {
                actions.push(Action::Poll { payout: p });
            }
        }
        for intent in &state.intents {
            actions.push(Action::Write { intent: *intent });
        }
    }

    fn worker_actions(&self, state: &State, w: u8, actions: &mut Vec<Action>) {
        let worker = state.workers[w as usize];
        if !worker.up {
            return;
        }
        if worker.paused {
            actions.push(Action::Resume { worker: w });
            return;
        }
        match worker.job {
            Delivery::Idle => {
                for (j, job) in state.jobs.iter().enumerate() {
                    if job.status == JobStatus::Eligible {
                        actions.push(Action::ClaimJob {
                            worker: w,
                            job: j as u8,
                        });
                    }
                }
            }
            Delivery::Claimed { .. } => {
                actions.push(Action::CallProvider {
                    worker: w,
                    answer: Answer::Accepted,
                });
                let b = state.budget;
                for (left, answer) in [
                    (b.provider_unavailable, Answer::Unavailable),
                    (b.applied_then_timed_out, Answer::AppliedThenTimedOut),
                    (b.refusals, Answer::Refused),
                ] {
                    if left > 0 {
                        actions.push(Action::CallProvider { worker: w, answer });
                    }
                }
            }
            Delivery::Called { answer: Some(_), .. } => actions.push(Action::RecordDelivery { worker: w }),
            Delivery::Called { answer: None, .. } => actions.push(Action::RetryLater { worker: w }),
        }
        let busy = worker.job != Delivery::Idle;
        if state.budget.crashes > 0 && busy {
            actions.push(Action::Crash { worker: w });
        }
        if state.budget.pauses > 0 && busy {
            actions.push(Action::Pause { worker: w });
        }
    }

    fn environment_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (j, job) in state.jobs.iter().enumerate() {
            let j = j as u8;
            let holder_running = state.workers.iter().any(|w| {
                w.up && !w.paused
                    && matches!(w.job, Delivery::Claimed { job, attempt, .. } | Delivery::Called { job, attempt, .. }
                        if job == j && attempt == state.jobs[j as usize].attempt)
            });
            if job.status == JobStatus::Processing && job.lease_live && !holder_running {
                actions.push(Action::LeaseExpires { job: j });
            }
            if job.status == JobStatus::Processing && !job.lease_live {
                actions.push(Action::Rescue { job: j });
            }
        }
        for (i, payment) in state.payments.iter().enumerate() {
            if payment.status == ProviderStatus::Pending {
                actions.push(Action::ProviderSettles {
                    payment: i as u8,
                    paid: true,
                });
                if state.budget.provider_failures > 0 {
                    actions.push(Action::ProviderSettles {
                        payment: i as u8,
                        paid: false,
                    });
                }
            }
        }
        let mut events = state.inflight.clone();
        events.dedup();
        for event in events {
            actions.push(Action::ReceiveWebhook { event });
            if state.budget.webhook_duplicates > 0 {
                actions.push(Action::DuplicateWebhook { event });
            }
            if state.budget.webhook_losses > 0 {
                actions.push(Action::LoseWebhook { event });
            }
        }
    }

    fn create(&self, s: &mut State, payout: u8) {
        if s.balance < 1 {
            s.payouts[payout as usize] = Slot::Refused;
            return;
        }
        s.balance -= 1;
        let state = if self.confirm {
            PayoutState::Created
        } else {
            PayoutState::Queued
        };
        s.payouts[payout as usize] = Slot::Row(PayoutRow {
            state,
            token_expired: false,
            returned: 0,
            confirmed: 0,
        });
        if state == PayoutState::Queued {
            s.jobs.push(JobRow {
                payout,
                status: JobStatus::Eligible,
                attempt: 0,
                lease_live: false,
            });
        }
    }

    fn claim(&self, s: &mut State, w: u8, j: u8) {
        let job = &mut s.jobs[j as usize];
        job.status = JobStatus::Processing;
        job.attempt += 1;
        job.lease_live = true;
        let (payout, attempt) = (job.payout, job.attempt);
        let seen = Self::row(s, payout).expect("a job's payout").state;
        s.workers[w as usize].job = Delivery::Claimed { job: j, attempt, seen };
    }

    fn call(&self, s: &mut State, w: u8, answer: Answer) {
        let Delivery::Claimed { job, attempt, seen } = s.workers[w as usize].job else {
            unreachable!("a call follows a claim")
        };
        let payout = s.jobs[job as usize].payout;
        let key = (!self.guards.idempotency_key).then_some(attempt);
        let existing = s.payments.iter().position(|p| p.payout == payout && p.attempt == key);
        match answer {
            Answer::Unavailable => s.budget.provider_unavailable -= 1,
            Answer::AppliedThenTimedOut => s.budget.applied_then_timed_out -= 1,
            Answer::Refused => s.budget.refusals -= 1,
            Answer::Accepted => {}
        }
        let status = match (existing, answer) {
            (_, Answer::Unavailable) => None,
            (Some(i), _) => Some(s.payments[i].status),
            (None, Answer::Refused) => Some(ProviderStatus::Refused),
            (None, _) => Some(ProviderStatus::Pending),
        };
        if existing.is_none() {
            if let Some(status) = status {
                s.payments.push(Payment {
                    payout,
                    attempt: key,
                    status,
                });
            }
        }
        let answer = if answer == Answer::AppliedThenTimedOut {
            None
        } else {
            status
        };
        s.workers[w as usize].job = Delivery::Called {
            job,
            attempt,
            seen,
            answer,
        };
    }

    fn record(&self, s: &mut State, w: u8) {
        let Delivery::Called {
            job,
            attempt,
            seen,
            answer: Some(status),
        } = s.workers[w as usize].job
        else {
            unreachable!("a record follows an answer")
        };
        s.workers[w as usize].job = Delivery::Idle;
        let row = s.jobs[job as usize];
        if row.status != JobStatus::Processing || row.attempt != attempt {
            return; // the fence refuses a zombie: nothing is written
        }
        s.jobs[job as usize].status = JobStatus::Done;
        s.jobs[job as usize].lease_live = false;
        let to = match status {
            ProviderStatus::Pending => PayoutState::Sent,
            ProviderStatus::Paid => PayoutState::Paid,
            ProviderStatus::Failed | ProviderStatus::Refused => PayoutState::Failed,
        };
        let payout = row.payout;
        // Without the conditional update the worker decides from the state
        // it loaded, and writes blind.
        if self.guards.state_condition || to.allowed_from().contains(&seen) {
            self.transition(s, payout, to, Source::Delivery);
        }
    }

    fn receive_webhook(&self, s: &mut State, event: u8) {
        let at = s.inflight.iter().position(|e| *e == event).expect("in flight");
        s.inflight.remove(at);
        if self.guards.event_id && s.events[event as usize] > 0 {
            return; // seen before: answered 200, applied no more
        }
        s.events[event as usize] += 1;
        let payment = s.payments[event as usize];
        let to = match payment.status {
            ProviderStatus::Paid => PayoutState::Paid,
            _ => PayoutState::Failed,
        };
        self.decide(s, payment.payout, to, Source::Webhook(event));
    }
}

impl Model for Payouts {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            balance: self.credit,
            payouts: vec![Slot::NotRequested; self.payouts as usize],
            jobs: Vec::new(),
            payments: Vec::new(),
            inflight: Vec::new(),
            events: Vec::new(),
            intents: Vec::new(),
            workers: vec![
                Worker {
                    up: true,
                    paused: false,
                    job: Delivery::Idle,
                };
                self.workers as usize
            ],
            budget: self.faults,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.payout_actions(state, actions);
        for w in 0..self.workers {
            self.worker_actions(state, w, actions);
        }
        self.environment_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::CreatePayout { payout } => self.create(&mut s, payout),
            Action::Redeem { payout } => {
                s.budget.redemptions -= 1;
                self.decide(&mut s, payout, PayoutState::Queued, Source::Confirm);
            }
            Action::TokenExpires { payout } => Self::row_mut(&mut s, payout).token_expired = true,
            Action::Expire { payout } => self.decide(&mut s, payout, PayoutState::Expired, Source::Sweeper),
            Action::Cancel { payout } => {
                s.budget.cancels -= 1;
                self.transition(&mut s, payout, PayoutState::Cancelled, Source::Creator);
            }
            Action::ClaimJob { worker, job } => self.claim(&mut s, worker, job),
            Action::CallProvider { worker, answer } => self.call(&mut s, worker, answer),
            Action::RecordDelivery { worker } => self.record(&mut s, worker),
            Action::RetryLater { worker } => {
                let Delivery::Called { job, attempt, .. } = s.workers[worker as usize].job else {
                    unreachable!("a retry follows a failed call")
                };
                let row = &mut s.jobs[job as usize];
                if row.status == JobStatus::Processing && row.attempt == attempt {
                    row.status = JobStatus::Eligible;
                    row.lease_live = false;
                }
                s.workers[worker as usize].job = Delivery::Idle;
            }
            Action::LeaseExpires { job } => s.jobs[job as usize].lease_live = false,
            Action::Rescue { job } => s.jobs[job as usize].status = JobStatus::Eligible,
            Action::ProviderSettles { payment, paid } => {
                if !paid {
                    s.budget.provider_failures -= 1;
                }
                s.payments[payment as usize].status = if paid {
                    ProviderStatus::Paid
                } else {
                    ProviderStatus::Failed
                };
                s.events.resize(s.payments.len(), 0);
                s.inflight.push(payment);
                s.inflight.sort();
            }
            Action::DuplicateWebhook { event } => {
                s.budget.webhook_duplicates -= 1;
                s.inflight.push(event);
                s.inflight.sort();
            }
            Action::LoseWebhook { event } => {
                s.budget.webhook_losses -= 1;
                let at = s.inflight.iter().position(|e| *e == event).expect("in flight");
                s.inflight.remove(at);
            }
            Action::ReceiveWebhook { event } => self.receive_webhook(&mut s, event),
            Action::Poll { payout } => {
                let (_, payment) = Self::payment_of(&s, payout).expect("a payment to look up");
                let to = if payment.status == ProviderStatus::Paid {
                    PayoutState::Paid
                } else {
                    PayoutState::Failed
                };
                self.decide(&mut s, payout, to, Source::Poll);
            }
            Action::Write { intent } => {
                let at = s.intents.iter().position(|i| *i == intent).expect("an intent");
                s.intents.remove(at);
                self.transition(&mut s, intent.payout, state_of(intent.to), intent.source);
            }
            Action::Crash { worker } => {
                s.budget.crashes -= 1;
                s.workers[worker as usize] = Worker {
                    up: false,
                    paused: false,
                    job: Delivery::Idle,
                };
            }
            Action::Pause { worker } => {
                s.budget.pauses -= 1;
                s.workers[worker as usize].paused = true;
            }
            Action::Resume { worker } => s.workers[worker as usize].paused = false,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(property::BALANCE_NOT_NEGATIVE, |_, s: &State| s.balance >= 0),
            Property::always(property::MONEY_CONSERVED, |m: &Payouts, s: &State| {
                let outstanding: i8 = s
                    .payouts
                    .iter()
                    .filter_map(|p| match p {
                        Slot::Row(row) => Some(i8::from(row.returned == 0)),
                        _ => None,
                    })
                    .sum();
                m.credit == s.balance + outstanding
            }),
            Property::always(property::RETURNED_AT_MOST_ONCE, |_, s: &State| {
                s.payouts
                    .iter()
                    .all(|p| !matches!(p, Slot::Row(row) if row.returned > 1))
            }),
            Property::always(property::RETURNED_ONLY_UNPAID, |_, s: &State| {
                s.payouts.iter().enumerate().all(|(i, p)| match p {
                    Slot::Row(row) if row.returned > 0 => !s
                        .payments
                        .iter()
                        .any(|pay| pay.payout == i as u8 && pay.status == ProviderStatus::Paid),
                    _ => true,
                })
            }),
            Property::always(property::PAID_AT_MOST_ONCE, |m: &Payouts, s: &State| {
                (0..m.payouts).all(|p| {
                    let applied = s
                        .payments
                        .iter()
                        .filter(|pay| pay.payout == p && pay.status != ProviderStatus::Refused)
                        .count();
                    applied <= 1
                })
            }),
            Property::always(property::EVENT_AT_MOST_ONCE, |_, s: &State| {
                s.events.iter().all(|n| *n <= 1)
            }),
            Property::eventually(property::EVERY_PAYOUT_ENDS, |_, s: &State| {
                s.payouts.iter().all(|p| match p {
                    Slot::NotRequested => false,
                    Slot::Refused => true,
                    Slot::Row(row) => {
                        (row.state == PayoutState::Paid && row.returned == 0)
                            || (row.state.returns_funds() && row.returned >= 1)
                    }
                })
            }),
            Property::sometimes("a payout is paid", |_, s: &State| {
                s.payouts
                    .iter()
                    .any(|p| matches!(p, Slot::Row(r) if r.state == PayoutState::Paid))
            }),
            Property::sometimes("a payout fails and its funds come back", |_, s: &State| {
                s.payouts
                    .iter()
                    .any(|p| matches!(p, Slot::Row(r) if r.state == PayoutState::Failed && r.returned == 1))
            }),
        ];
        if self.confirm {
            properties.push(Property::always(property::TOKEN_ONCE, |_, s: &State| {
                s.payouts
                    .iter()
                    .all(|p| !matches!(p, Slot::Row(row) if row.confirmed > 1))
            }));
            properties.push(Property::sometimes("an unconfirmed payout expires", |_, s: &State| {
                s.payouts
                    .iter()
                    .any(|p| matches!(p, Slot::Row(r) if r.state == PayoutState::Expired))
            }));
        }
        if self.faults.webhook_duplicates > 0 {
            properties.push(Property::sometimes(
                "a duplicated webhook is answered and ignored",
                |_, s: &State| s.events.contains(&1) && s.budget.webhook_duplicates == 0 && s.inflight.is_empty(),
            ));
        }
        properties
    }
}

impl Described for Payouts {
    fn name(&self) -> String {
        let mut guards = Vec::new();
        if !self.guards.state_condition {
            guards.push("no conditional update on the state");
        }
        if !self.guards.event_id {
            guards.push("no unique event id");
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
            "payouts ({} payout(s){}, balance {}, {} delivery workers; {} crash, {} pause, {} 503, \
             {} applied-then-timed-out, {} refusal, {} failed payment, {} duplicated and {} lost webhook, \
             {} redemptions, {} cancel{guards})",
            self.payouts,
            if self.confirm { " with confirmation" } else { "" },
            self.credit,
            self.workers,
            f.crashes,
            f.pauses,
            f.provider_unavailable,
            f.applied_then_timed_out,
            f.refusals,
            f.provider_failures,
            f.webhook_duplicates,
            f.webhook_losses,
            f.redemptions,
            f.cancels
        )
    }

    fn describe(&self, s: &State) -> String {
        let payouts: Vec<String> = s
            .payouts
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Slot::NotRequested => format!("p{i} -"),
                Slot::Refused => format!("p{i} refused"),
                Slot::Row(r) => {
                    let returned = if r.returned > 0 {
                        format!(" returned x{}", r.returned)
                    } else {
                        String::new()
                    };
                    format!("p{i} {:?}{returned}", r.state).to_lowercase()
                }
            })
            .collect();
        let jobs: Vec<String> = s
            .jobs
            .iter()
            .enumerate()
            .map(|(j, job)| format!("job{j}(p{}) {:?} a{}", job.payout, job.status, job.attempt).to_lowercase())
            .collect();
        let payments: Vec<String> = s
            .payments
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "e{i}:p{}{} {:?}",
                    p.payout,
                    p.attempt.map_or(String::new(), |a| format!("/a{a}")),
                    p.status
                )
            })
            .collect();
        let inflight: Vec<String> = s.inflight.iter().map(|e| format!("e{e}")).collect();
        let mut out = format!(
            "balance {} [{}] jobs [{}] provider [{}] webhooks in flight [{}]",
            s.balance,
            payouts.join(", "),
            jobs.join(", "),
            payments.join(", "),
            inflight.join(", ")
        );
        if !s.intents.is_empty() {
            let intents: Vec<String> = s
                .intents
                .iter()
                .map(|i| format!("{:?} read p{}: will write {:?}", i.source, i.payout, state_of(i.to)))
                .collect();
            out.push_str(&format!(" | read, not yet written: [{}]", intents.join(", ")));
        }
        out
    }
}
