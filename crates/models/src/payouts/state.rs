//! The model's state: the rows it stands for (payouts, their keys, delivery
//! jobs, the provider's payments and webhooks) and what a write of a
//! payout's state came to.

use super::Faults;

/// `settlement.payouts.status`: the product's own enum, so the model's
/// states are the code's (tests/tables.rs holds both to the database).
pub use settled::payouts::PayoutState;

use PayoutState::{Cancelled, Created, Expired, Failed, Paid, Queued, Returned, Sent};

/// Every move the model allows, (from, to): what it takes
/// `settlement.payout_transitions` to hold (a test compares the two).
pub fn transitions() -> Vec<(PayoutState, PayoutState)> {
    PayoutState::ALL
        .iter()
        .flat_map(|&to| allowed_from(to).iter().map(move |&from| (from, to)))
        .collect()
}

/// The states `settlement.payout_transitions` lets a payout move to `to`
/// from (what the trigger `check_payout_change` checks).
pub(super) fn allowed_from(to: PayoutState) -> &'static [PayoutState] {
    match to {
        Created => &[],
        Queued => &[Created],
        Sent => &[Queued],
        Paid | Failed => &[Queued, Sent],
        Returned => &[Queued, Sent, Paid],
        Cancelled | Expired => &[Created],
    }
}

/// A payout request's key, `settled_engine.idempotency_keys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyRow {
    /// No row.
    Free,
    /// `status = 'in_progress'`; `locked`: `locked_until > now()`.
    InProgress {
        /// The lock has not passed.
        locked: bool,
    },
    /// `status = 'completed'`: its answer stored.
    Completed,
}

/// A payout request: one `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// Its first POST was sent.
    pub posted: bool,
    /// Its key's row.
    pub key: KeyRow,
    /// Answered 409 insufficient funds (stored under the key).
    pub refused: bool,
}

/// A `POST /v1/payouts` past `idempotency::begin`, in `pay()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Post {
    /// Its request.
    pub request: u8,
    /// Without the key's guards: what its read (`SELECT .. FROM payouts
    /// WHERE idempotency_key = $1`) found, before its write.
    pub read: Option<bool>,
}

/// A row of `settlement.payouts`, with what its transitions wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayoutRow {
    /// `idempotency_key`: the request that made it.
    pub request: u8,
    /// `status`
    pub state: PayoutState,
    /// `expires_at <= now()` (and its token's): the confirmation window passed.
    pub token_expired: bool,
    /// Rows of `settlement.payout_returns` (funds back on the balance).
    pub returned: u8,
    /// Redemptions of its token that committed (the token's `status` is
    /// `completed` after the first).
    pub confirmed: u8,
}

/// A delivery job's `status` (`settlement.payout_jobs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobStatus {
    /// `eligible`
    Eligible,
    /// `processing` (leased)
    Processing,
    /// `settled`: the provider's answer recorded.
    Settled,
    /// `failed`: a dead letter, its payout still queued.
    Dead,
}

/// A delivery job (a row of `settlement.payout_jobs`, keyed by its payout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobRow {
    /// `payout_id`
    pub payout: u8,
    /// `status`
    pub status: JobStatus,
    /// `attempt` (the fence).
    pub attempt: u8,
    /// `attempt - attempt_base`: attempts counted toward the limit.
    pub spent: u8,
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
    /// Refused at creation (stored under the key): no money left.
    Refused,
    /// Paid, then returned by the bank: the money came back.
    Returned,
}

/// The webhook event a payment's change sends: `payment.paid` or
/// `payment.failed` when it settles (event `2 * payment`), and
/// `payment.returned` when it comes back (event `2 * payment + 1`).
pub fn event_of(payment: u8, returned: bool) -> u8 {
    payment * 2 + u8::from(returned)
}

/// Event `event`'s payment, and whether it is the return.
pub(super) fn event_parts(event: u8) -> (u8, bool) {
    (event / 2, event % 2 == 1)
}

/// How an event is written in traces: `e0` (payment 0 settled), `e0r`
/// (payment 0 returned).
pub fn event_name(event: u8) -> String {
    let (payment, returned) = event_parts(event);
    format!("e{payment}{}", if returned { "r" } else { "" })
}

/// What a delivery's `work` hands to its completion (`Delivered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivered {
    /// `Delivered::Word`: the payment's status.
    Word(ProviderStatus),
    /// `Delivered::Refused`.
    Refused,
    /// `Delivered::Nothing`: the payout was not `queued` when loaded.
    Nothing,
}

/// What a delivery worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Between jobs.
    Idle,
    /// The job is claimed and its payout loaded `queued`.
    Claimed {
        /// The job.
        job: u8,
        /// The fence.
        attempt: u8,
    },
    /// `work` returned.
    Worked {
        /// The job.
        job: u8,
        /// The fence.
        attempt: u8,
        /// The payout's state as loaded.
        seen: PayoutState,
        /// What it delivered (None: a snooze, the provider down or late).
        outcome: Option<Delivered>,
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
    /// `poll_sent`.
    Poll,
    /// `POST /v1/payouts/{id}/confirm`.
    Confirm,
    /// `expire_unconfirmed`.
    Sweeper,
    /// `POST /v1/payouts/{id}/cancel`.
    Creator,
}

/// A transition read and decided, not yet written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Intent {
    /// The payout.
    pub payout: u8,
    /// Where to.
    pub to: PayoutState,
    /// Who.
    pub source: Source,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// `settlement.creator_balance.balance`.
    pub balance: i8,
    /// The payout requests.
    pub requests: Vec<Request>,
    /// Requests in `pay()` (sorted: any order).
    pub posts: Vec<Post>,
    /// `settlement.payouts` (a payout's id is its index).
    pub payouts: Vec<PayoutRow>,
    /// `settlement.payout_jobs`.
    pub jobs: Vec<JobRow>,
    /// Payments at the provider (each with two event ids: [`event_of`]).
    pub payments: Vec<Payment>,
    /// Webhook deliveries in flight (event ids, sorted: any order).
    pub inflight: Vec<u8>,
    /// `settlement.provider_events`: rows of each event id.
    pub events: Vec<u8>,
    /// Transitions read and decided, not yet written.
    pub intents: Vec<Intent>,
    /// The delivery workers.
    pub workers: Vec<Worker>,
    /// Faults left.
    pub budget: Faults,
}

impl State {
    /// A queued payout's delivery job, made once (`INSERT INTO payout_jobs
    /// .. ON CONFLICT (payout_id) DO NOTHING`).
    pub(super) fn enqueue(&mut self, payout: u8) {
        if !self.jobs.iter().any(|j| j.payout == payout) {
            self.jobs.push(JobRow {
                payout,
                status: JobStatus::Eligible,
                attempt: 0,
                spent: 0,
                lease_live: false,
            });
        }
    }
}

/// What a write of a payout's state came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    /// The state changed (with its return or its job).
    Moved,
    /// `move_payout` answered false: the payout was in none of its `from`.
    NotMoved,
    /// A blind write of the state it already had: the triggers record
    /// nothing, and the transaction commits.
    Unchanged,
    /// A trigger or a key raised: the transaction rolls back.
    Refused,
}
