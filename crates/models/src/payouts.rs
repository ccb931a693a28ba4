//! The payouts model: the payout protocol as built in
//! `crates/settled/src/payouts/{mod.rs,deliver.rs}`,
//! `crates/settled/src/api/{payouts.rs,provider_events.rs}` and migration
//! `20261203000501_payout_lifecycle.sql`.
//!
//! What it holds: a creator's balance; payout requests (`POST /v1/payouts`
//! with an `Idempotency-Key`, sent again by a client that timed out); the
//! key claimed (`idempotency::begin`), the debit, the payout row, its
//! delivery job and the stored answer committed in one transaction; payouts
//! through their states (created, queued, sent, paid, failed, cancelled,
//! expired), each move checked against `settlement.payout_transitions`;
//! confirmation tokens redeemed by racing requests and expiring; the
//! creator's cancel and the sweeper's expiry of unconfirmed payouts;
//! a paid payment the provider returns later (`payment.returned`, applied by
//! its webhook or a look-up of paid payouts, or before its `paid` was
//! heard: sent straight to returned), its funds back once;
//! delivery in leased mode on the continuous queue `payout_delivery`, with
//! the payout's own provider key, crashes and paused zombies rescued,
//! snoozes that spend no attempt, and a dead letter (attempts spent) that
//! keeps its payout queued until an operator replays it; a provider that
//! accepts a payment as pending and later pays or fails it, answers 503,
//! applies and then times out, or refuses; its webhooks duplicated and
//! lost; polling of payouts that stay sent; funds returned in the same
//! transaction as the transition that fails, cancels or expires a payout.
//!
//! The guards are the code's, each removable on its own ([`Guards`]), and
//! several stand behind one another: every move is a conditional update
//! (`move_payout`), the trigger `check_payout_change` refuses a move the
//! transitions table has not, and `payout_returns`' primary key refuses a
//! second return. Without the conditional update the application reads the
//! state, decides, and writes it blind: the model then splits each
//! transition into its read and its write. With it the read decides
//! nothing, so the two are one step.
//!
//! Left out: `failed` after `paid` from a provider without a returned
//! status (the database reads it as the same return; the model's provider
//! says `returned`), the provider's key window (tests/key_window.rs in the
//! CLI's tests drives it), settlement payouts (`record_settlement_payment` makes them in
//! the leased completion's transaction as `sent`, `paid` or `failed`; from
//! there they are this machine's sent payouts, without a delivery job),
//! holds, the provider's rate limits (a snooze, like a 503), and operators
//! cancelling a delivery job by hand.

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
    /// A paid payment the provider returns later (`payment.returned`).
    pub returns: u8,
    /// Requests redeeming a payout's confirmation token (racing ones too).
    pub redemptions: u8,
    /// A creator cancelling an unconfirmed payout.
    pub cancels: u8,
    /// `POST /v1/payouts` sent again with the same key before an answer (a
    /// client that timed out, through another server).
    pub request_repeats: u8,
    /// A request paused past its key's `locked_until`, so a repeat takes
    /// the key over (`idempotency::begin`).
    pub key_lock_expiries: u8,
}

/// The guards a variant may go without: each is a statement or a
/// constraint of the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guards {
    /// `settlement.move_payout`: `UPDATE payouts .. WHERE id = $1 AND
    /// status = ANY(from_states)`, its answer the truth (and the sweeper's
    /// `expire_unconfirmed_payouts`, `.. AND status = 'created'`). Without
    /// it: the state read, then written blind.
    pub state_condition: bool,
    /// The trigger `check_payout_change`: a change of `status` that
    /// `settlement.payout_transitions` does not list raises, and its
    /// transaction rolls back.
    pub transition_table: bool,
    /// `settlement.payout_returns`' primary key: a second return of a
    /// payout raises, and its transaction rolls back.
    pub one_return: bool,
    /// `OnceToken::redeem_in`: `UPDATE once_tokens .. WHERE id = $1 AND
    /// status = 'issued' AND expires_at > now()`. Without it only the
    /// expiry is checked.
    pub one_time_token: bool,
    /// `settlement.provider_events`' primary key: `INSERT .. ON CONFLICT
    /// (id) DO NOTHING`, a repeat rolled back and answered 200.
    pub event_id: bool,
    /// The provider key derived from the payout (`provider_key`, a
    /// generated column). Without it, each delivery attempt sends a key of
    /// its own.
    pub idempotency_key: bool,
    /// `idempotency::begin` and `finish`: a request's key claimed (a
    /// repeat answered 409 while the first holds it, or taking it over once
    /// its lock passed), and its answer stored in the payout's transaction
    /// only while the key is in progress (else the transaction rolls back).
    pub request_key: bool,
    /// `payouts.idempotency_key UNIQUE`: a second payout of one key raises.
    pub unique_request_key: bool,
}

impl Guards {
    /// Every guard the code has.
    pub const ALL: Guards = Guards {
        state_condition: true,
        transition_table: true,
        one_return: true,
        one_time_token: true,
        event_id: true,
        idempotency_key: true,
        request_key: true,
        unique_request_key: true,
    };
}

/// The payouts model at some bounds.
#[derive(Debug, Clone)]
pub struct Payouts {
    /// Payout requests (each of one unit, under a key of its own), made in order.
    pub requests: u8,
    /// The creator's balance before them (settled rewards).
    pub credit: i8,
    /// Payouts are created with `"confirm": true` (a token to redeem).
    pub confirm: bool,
    /// Delivery workers.
    pub workers: u8,
    /// Attempts of a delivery job before it is a dead letter
    /// (`RetryPolicy::max_attempts`; `settled deliver` has 25).
    pub max_attempts: u8,
    /// Faults and races.
    pub faults: Faults,
    /// The guards in force.
    pub guards: Guards,
}

/// `settlement.payouts.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    /// `returned`: paid, then the provider took it back (funds returned)
    Returned,
}

use PayoutState::{Cancelled, Created, Expired, Failed, Paid, Queued, Returned, Sent};

impl PayoutState {
    /// Every state.
    pub const ALL: [PayoutState; 8] = [Created, Queued, Sent, Paid, Failed, Cancelled, Expired, Returned];

    /// Its value in `settlement.payouts.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Created => "created",
            Queued => "queued",
            Sent => "sent",
            Paid => "paid",
            Failed => "failed",
            Cancelled => "cancelled",
            Expired => "expired",
            Returned => "returned",
        }
    }

    /// Every move the model allows, (from, to): what it takes
    /// `settlement.payout_transitions` to hold (a test compares the two).
    pub fn transitions() -> Vec<(PayoutState, PayoutState)> {
        PayoutState::ALL
            .iter()
            .flat_map(|&to| to.allowed_from().iter().map(move |&from| (from, to)))
            .collect()
    }

    fn returns_funds(self) -> bool {
        matches!(self, Failed | Returned | Cancelled | Expired)
    }

    /// The states `settlement.payout_transitions` lets a payout move to
    /// `self` from (what the trigger `check_payout_change` checks).
    fn allowed_from(self) -> &'static [PayoutState] {
        match self {
            Created => &[],
            Queued => &[Created],
            Sent => &[Queued],
            Paid | Failed => &[Queued, Sent],
            Returned => &[Queued, Sent, Paid],
            Cancelled | Expired => &[Created],
        }
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
fn event_parts(event: u8) -> (u8, bool) {
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

/// What can happen. Each action names the function and the statement it
/// models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `payouts::create` (api/payouts.rs): `idempotency::begin` inserts
    /// the key `in_progress`, or takes over one whose `locked_until` passed;
    /// otherwise 409 (in progress) or the stored answer. A repeat is the
    /// client sending the same key again.
    PostPayout {
        /// The request.
        request: u8,
    },
    /// `pay()` (api/payouts.rs), one transaction: `SELECT .. FROM payouts
    /// WHERE idempotency_key = $1` (an earlier payout is answered again);
    /// `settlement.debit_for_payout` (the conditional debit, the payout row
    /// `created` with a token or `queued` with its job, or insufficient
    /// funds); `idempotency::finish` (`UPDATE idempotency_keys .. WHERE
    /// status = 'in_progress'`, else the transaction rolls back). Without
    /// the key's guards, its read and its write are two steps.
    Pay {
        /// The request in flight.
        post: Post,
    },
    /// The request's `locked_until` passes while it is in `pay()`.
    KeyLockExpires {
        /// The request.
        request: u8,
    },
    /// `confirm_in_tx` (api/payouts.rs), one transaction: `redeem_in` and
    /// `move_payout(id, [created], queued)` with its delivery job. Without
    /// the conditional update, this is its read.
    Redeem {
        /// The payout.
        payout: u8,
    },
    /// The database clock passes the payout's `expires_at` (its token's too).
    TokenExpires {
        /// The payout.
        payout: u8,
    },
    /// `expire_unconfirmed` (`expire_unconfirmed_payouts`: `UPDATE payouts
    /// SET status = 'expired' .. WHERE status = 'created' AND expires_at <=
    /// now()`), the return by the trigger. Without the conditional update,
    /// this is its read.
    Expire {
        /// The payout.
        payout: u8,
    },
    /// `payouts::cancel` (api/payouts.rs): `move_payout(id, [created],
    /// cancelled)`, the return by the trigger. Without the conditional
    /// update, this is its read.
    Cancel {
        /// The payout.
        payout: u8,
    },
    /// `claim_leased` of a delivery job (attempt + 1), then `Deliver::work`
    /// loads its payout (`Delivered::Nothing` unless `queued`).
    ClaimJob {
        /// The worker.
        worker: u8,
        /// The job.
        job: u8,
    },
    /// `Deliver::work`: `PayoutProvider::pay(provider_key, ..)`.
    CallProvider {
        /// The worker.
        worker: u8,
        /// What the provider does.
        answer: Answer,
    },
    /// `complete_once` (the engine's leased serve): `complete_fenced`, then
    /// `Deliver::complete` (`apply_word`, or `move_payout(id, [queued],
    /// failed)` for a refusal), one transaction.
    RecordDelivery {
        /// The worker.
        worker: u8,
    },
    /// `record_failure` of a `HandlerError::Snooze`: `snooze_fenced`
    /// (eligible later, `attempt_base + 1`: no attempt spent).
    Snooze {
        /// The worker.
        worker: u8,
    },
    /// The database clock passes a job's `lease_until` (its worker is down
    /// or stopped, or its completion rolled back).
    LeaseExpires {
        /// The job.
        job: u8,
    },
    /// `rescue_expired`: the job eligible again, or `failed` (a dead
    /// letter) once `attempt - attempt_base >= max_attempts`.
    Rescue {
        /// The job.
        job: u8,
    },
    /// An operator's `Queue::replay` of a dead letter (`status = 'eligible',
    /// attempt_base = attempt`).
    ReplayDeadLetter {
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
    /// The bank returns a paid payment: it is `returned` at the provider,
    /// and its webhook (`payment.returned`) sent.
    ProviderReturns {
        /// The payment.
        payment: u8,
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
    /// `provider_events::record`, one transaction: `apply_word` (each move
    /// conditional), then `INSERT INTO provider_events .. ON CONFLICT (id)
    /// DO NOTHING` (none inserted: rolled back, answered 200). Without the
    /// conditional update, this is its read.
    ReceiveWebhook {
        /// The event.
        event: u8,
    },
    /// `deliver::poll`: a payout still `sent`, or `paid` within the returns
    /// watch, looked up and moved by `apply_word`. Without the conditional
    /// update, this is its read.
    Poll {
        /// The payout.
        payout: u8,
    },
    /// Without the conditional update: the blind write of a transition read
    /// before (`UPDATE payouts SET status = $to WHERE id = $1`), with what
    /// commits with it (the token, the event, the job); the trigger's
    /// checks still apply unless removed.
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
            Action::PostPayout { request } => write!(f, "POST /v1/payouts (key k{request}): idempotency::begin"),
            Action::Pay { post } => match post.read {
                Some(found) => write!(
                    f,
                    "pay() k{}: debit_for_payout + finish (after reading {})",
                    post.request,
                    if found { "a payout" } else { "none" }
                ),
                None => write!(f, "pay() k{}", post.request),
            },
            Action::KeyLockExpires { request } => write!(f, "clock passes key k{request}'s locked_until"),
            Action::Redeem { payout } => write!(f, "POST /v1/payouts/{payout}/confirm"),
            Action::TokenExpires { payout } => write!(f, "clock passes payout {payout}'s expires_at"),
            Action::Expire { payout } => write!(f, "expire_unconfirmed (payout {payout})"),
            Action::Cancel { payout } => write!(f, "POST /v1/payouts/{payout}/cancel"),
            Action::ClaimJob { worker, job } => {
                write!(f, "w{worker} claim_leased (delivery job {job}), work loads the payout")
            }
            Action::CallProvider { worker, answer } => {
                write!(f, "w{worker} work: provider pay(key) answers {answer:?}")
            }
            Action::RecordDelivery { worker } => write!(f, "w{worker} complete_fenced + Deliver::complete"),
            Action::Snooze { worker } => write!(f, "w{worker} snooze_fenced"),
            Action::LeaseExpires { job } => write!(f, "clock passes job {job}'s lease_until"),
            Action::Rescue { job } => write!(f, "rescue_expired (job {job})"),
            Action::ReplayDeadLetter { job } => write!(f, "operator replays dead letter (job {job})"),
            Action::ProviderSettles { payment, paid } => {
                let outcome = if paid { "paid" } else { "failed" };
                write!(f, "provider: payment {payment} {outcome}, webhook e{payment} sent")
            }
            Action::ProviderReturns { payment } => {
                write!(
                    f,
                    "provider: payment {payment} returned, webhook {} sent",
                    event_name(event_of(payment, true))
                )
            }
            Action::DuplicateWebhook { event } => write!(f, "network duplicates webhook {}", event_name(event)),
            Action::LoseWebhook { event } => write!(f, "network loses webhook {}", event_name(event)),
            Action::ReceiveWebhook { event } => write!(f, "POST /v1/provider-events ({})", event_name(event)),
            Action::Poll { payout } => write!(f, "poll looks up payout {payout}"),
            Action::Write { intent } => write!(
                f,
                "{:?} writes payout {} {:?} (blind)",
                intent.source, intent.payout, intent.to
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
    pub const REQUEST_ONCE: &str = "a payout request (its Idempotency-Key) makes at most one payout";
    /// Safety.
    pub const EVENT_AT_MOST_ONCE: &str = "each provider event is recorded at most once";
    /// Safety.
    pub const TOKEN_ONCE: &str = "a confirmation token is redeemed at most once";
    /// Liveness.
    pub const EVERY_PAYOUT_ENDS: &str =
        "every request is answered and every payout ends paid, or with its funds returned (a payment the provider returned, returned)";
}

/// What a write of a payout's state came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
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

impl Payouts {
    /// Bounds `cargo test` checks: one payout with a confirmation token
    /// (two redemptions racing, a cancel, the expiry), every delivery fault,
    /// one attempt before a dead letter.
    pub fn ci_confirmed() -> Payouts {
        Payouts {
            requests: 1,
            credit: 1,
            confirm: true,
            workers: 2,
            max_attempts: 1,
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
                request_repeats: 0,
                key_lock_expiries: 0,
                returns: 0,
            },
            guards: Guards::ALL,
        }
    }

    /// Bounds `cargo test` checks: two payouts on a balance for one.
    pub fn ci_two_payouts() -> Payouts {
        Payouts {
            requests: 2,
            credit: 1,
            confirm: false,
            workers: 2,
            max_attempts: 2,
            faults: Faults {
                crashes: 1,
                applied_then_timed_out: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                ..Faults::default()
            },
            guards: Guards::ALL,
        }
    }

    /// Bounds `cargo test` checks: one request sent twice with its key, the
    /// first one's key lock passing, on a balance for two.
    pub fn ci_repeated_request() -> Payouts {
        Payouts {
            requests: 1,
            credit: 2,
            confirm: false,
            workers: 2,
            max_attempts: 1,
            faults: Faults {
                crashes: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                request_repeats: 1,
                key_lock_expiries: 1,
                ..Faults::default()
            },
            guards: Guards::ALL,
        }
    }

    /// Bounds `cargo test` checks: one payout, its payment paid and then
    /// returned by the bank (or failed), the webhooks (its paid, its
    /// returned) duplicated and lost, in any order, so the return is heard
    /// before its paid, twice, or only by a look-up.
    pub fn ci_returned() -> Payouts {
        Payouts {
            requests: 1,
            credit: 1,
            confirm: false,
            workers: 1,
            max_attempts: 1,
            faults: Faults {
                applied_then_timed_out: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                returns: 1,
                ..Faults::default()
            },
            guards: Guards::ALL,
        }
    }

    /// Deeper bounds: two payouts, both returned, every delivery fault.
    pub fn deep_returned() -> Payouts {
        Payouts {
            requests: 2,
            credit: 2,
            workers: 2,
            faults: Faults {
                crashes: 1,
                provider_failures: 1,
                webhook_duplicates: 2,
                returns: 2,
                ..Payouts::ci_returned().faults
            },
            ..Payouts::ci_returned()
        }
    }

    /// Deeper bounds (`--deep`): two confirmed payouts on a balance for both.
    pub fn deep_confirmed() -> Payouts {
        Payouts {
            requests: 2,
            credit: 2,
            ..Payouts::ci_confirmed()
        }
    }

    /// Deeper bounds: two payouts on a balance for one, every delivery fault.
    pub fn deep_two_payouts() -> Payouts {
        Payouts {
            requests: 2,
            credit: 1,
            confirm: false,
            workers: 2,
            max_attempts: 1,
            faults: Faults {
                crashes: 1,
                pauses: 1,
                provider_unavailable: 1,
                applied_then_timed_out: 1,
                refusals: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                ..Faults::default()
            },
            guards: Guards::ALL,
        }
    }

    /// Deeper bounds: two requests, each sent again, a key lock passing,
    /// on a balance for three.
    pub fn deep_repeated_requests() -> Payouts {
        let ci = Payouts::ci_repeated_request();
        Payouts {
            requests: 2,
            credit: 3,
            faults: Faults {
                request_repeats: 2,
                ..ci.faults
            },
            ..ci
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> Payouts {
        self.guards = guards;
        self
    }

    /// The provider's payment for a payout's key (the latest, when each
    /// attempt has a key of its own).
    fn payment_of(state: &State, payout: u8) -> Option<Payment> {
        state.payments.iter().rfind(|p| p.payout == payout).copied()
    }

    /// A request has its answer: a payout, or a refusal.
    fn answered(state: &State, request: u8) -> bool {
        state.requests[request as usize].refused || state.payouts.iter().any(|p| p.request == request)
    }

    /// A move and what commits with it: the return (the trigger
    /// `record_payout_transition`: a `payout_returns` row and the credit),
    /// or the delivery job (`INSERT INTO payout_jobs .. ON CONFLICT
    /// (payout_id) DO NOTHING`).
    fn apply(s: &mut State, payout: u8, to: PayoutState) {
        let row = &mut s.payouts[payout as usize];
        row.state = to;
        if to.returns_funds() {
            row.returned += 1;
            s.balance += 1;
        }
        if to == Queued && !s.jobs.iter().any(|j| j.payout == payout) {
            s.jobs.push(JobRow {
                payout,
                status: JobStatus::Eligible,
                attempt: 0,
                spent: 0,
                lease_live: false,
            });
        }
    }

    /// The write of a payout's state: `move_payout(id, from, to)` with the
    /// guard; else a blind `UPDATE .. SET status = $to WHERE id = $1`, as
    /// the trigger and the return's key let it.
    fn write(&self, s: &mut State, payout: u8, from: &[PayoutState], to: PayoutState) -> Written {
        let row = s.payouts[payout as usize];
        if self.guards.state_condition {
            if !from.contains(&row.state) {
                return Written::NotMoved;
            }
        } else if row.state == to {
            return Written::Unchanged;
        } else {
            // The trigger raises for a move the table does not list; the
            // return's primary key for a second return.
            let unlisted = self.guards.transition_table && !to.allowed_from().contains(&row.state);
            let returned_again = to.returns_funds() && self.guards.one_return && row.returned > 0;
            if unlisted || returned_again {
                return Written::Refused;
            }
        }
        Self::apply(s, payout, to);
        Written::Moved
    }

    /// The transaction of `source` around its write of `to`.
    fn commit(&self, s: &mut State, payout: u8, from: &[PayoutState], to: PayoutState, source: Source) {
        match source {
            Source::Webhook(event) => {
                if self.guards.event_id && s.events[event as usize] > 0 {
                    return; // the insert finds the event: rolled back, answered 200
                }
                if self.write(s, payout, from, to) == Written::Refused {
                    // Answered 5xx: the provider sends the event again.
                    s.inflight.push(event);
                    s.inflight.sort();
                } else {
                    s.events[event as usize] += 1;
                }
            }
            Source::Confirm => {
                let row = s.payouts[payout as usize];
                if row.token_expired || (self.guards.one_time_token && row.confirmed > 0) {
                    return; // redeem_in answered false: rolled back
                }
                if matches!(self.write(s, payout, from, to), Written::Moved | Written::Unchanged) {
                    s.payouts[payout as usize].confirmed += 1;
                }
            }
            _ => {
                self.write(s, payout, from, to);
            }
        }
    }

    /// A transition from one of `from` to `to` by `source`: with the guard,
    /// its transaction now; without, its read (an intent to write, when the
    /// state read is one of `from`).
    fn decide(&self, s: &mut State, payout: u8, from: &[PayoutState], to: PayoutState, source: Source) {
        if self.guards.state_condition {
            return self.commit(s, payout, from, to, source);
        }
        if from.contains(&s.payouts[payout as usize].state) {
            s.intents.push(Intent { payout, to, source });
            s.intents.sort();
        } else if let Source::Webhook(event) = source {
            // Nothing to move: the event is stored, as `already`.
            if !(self.guards.event_id && s.events[event as usize] > 0) {
                s.events[event as usize] += 1;
            }
        }
    }

    /// A source may read again only once its earlier read is written.
    fn reading(state: &State, payout: u8, source: Source) -> bool {
        state.intents.iter().any(|i| i.payout == payout && i.source == source)
    }

    fn request_actions(&self, state: &State, actions: &mut Vec<Action>) {
        if let Some(next) = state.requests.iter().position(|r| !r.posted) {
            actions.push(Action::PostPayout { request: next as u8 });
        }
        for (r, request) in state.requests.iter().enumerate() {
            let r = r as u8;
            if request.posted && state.budget.request_repeats > 0 && !Self::answered(state, r) {
                actions.push(Action::PostPayout { request: r });
            }
            let in_pay = state.posts.iter().any(|p| p.request == r);
            if request.key == (KeyRow::InProgress { locked: true }) && in_pay && state.budget.key_lock_expiries > 0 {
                actions.push(Action::KeyLockExpires { request: r });
            }
        }
        let mut posts = state.posts.clone();
        posts.dedup();
        for post in posts {
            actions.push(Action::Pay { post });
        }
    }

    fn payout_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (p, row) in state.payouts.iter().enumerate() {
            let p = p as u8;
            let readable = |source| self.guards.state_condition || !Self::reading(state, p, source);
            if row.state == Created {
                if !row.token_expired {
                    if state.budget.redemptions > 0 {
                        actions.push(Action::Redeem { payout: p });
                    }
                    actions.push(Action::TokenExpires { payout: p });
                } else if readable(Source::Sweeper) {
                    actions.push(Action::Expire { payout: p });
                }
                if state.budget.cancels > 0 && readable(Source::Creator) {
                    actions.push(Action::Cancel { payout: p });
                }
            }
            let at_provider = Self::payment_of(state, p).map(|pay| pay.status);
            let news = match row.state {
                Sent => matches!(
                    at_provider,
                    Some(ProviderStatus::Paid | ProviderStatus::Failed | ProviderStatus::Returned)
                ),
                // Paid payouts are looked up again for a while: a return.
                Paid => at_provider == Some(ProviderStatus::Returned),
                _ => false,
            };
            if news && readable(Source::Poll) {
                actions.push(Action::Poll { payout: p });
            }
        }
        let mut intents = state.intents.clone();
        intents.dedup();
        for intent in intents {
            actions.push(Action::Write { intent });
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
            Delivery::Worked { outcome: Some(_), .. } => actions.push(Action::RecordDelivery { worker: w }),
            Delivery::Worked { outcome: None, .. } => actions.push(Action::Snooze { worker: w }),
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
                    && matches!(w.job, Delivery::Claimed { job, attempt } | Delivery::Worked { job, attempt, .. }
                        if job == j && attempt == state.jobs[j as usize].attempt)
            });
            match job.status {
                JobStatus::Processing if job.lease_live && !holder_running => {
                    actions.push(Action::LeaseExpires { job: j })
                }
                JobStatus::Processing if !job.lease_live => actions.push(Action::Rescue { job: j }),
                JobStatus::Dead => actions.push(Action::ReplayDeadLetter { job: j }),
                _ => {}
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
        if state.budget.returns > 0 {
            for (i, payment) in state.payments.iter().enumerate() {
                if payment.status == ProviderStatus::Paid {
                    actions.push(Action::ProviderReturns { payment: i as u8 });
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

    fn post(&self, s: &mut State, r: u8) {
        let request = &mut s.requests[r as usize];
        if request.posted {
            s.budget.request_repeats -= 1;
        } else {
            request.posted = true;
        }
        if self.guards.request_key {
            match request.key {
                KeyRow::Free | KeyRow::InProgress { locked: false } => {
                    request.key = KeyRow::InProgress { locked: true };
                }
                // 409 in progress, or the stored answer.
                KeyRow::InProgress { locked: true } | KeyRow::Completed => return,
            }
        }
        s.posts.push(Post { request: r, read: None });
        s.posts.sort();
    }

    fn pay(&self, s: &mut State, post: Post) {
        let at = s.posts.iter().position(|p| *p == post).expect("a request in pay()");
        s.posts.remove(at);
        let r = post.request;
        let found = match post.read {
            Some(found) => found,
            None => {
                let found = s.payouts.iter().any(|p| p.request == r);
                // With either guard the read decides nothing: a second
                // payout's insert meets the unique key, a second answer
                // finds the key completed, and either rolls back. So the
                // read and the write are one step; without both, two.
                if !self.guards.request_key && !self.guards.unique_request_key {
                    s.posts.push(Post {
                        request: r,
                        read: Some(found),
                    });
                    s.posts.sort();
                    return;
                }
                found
            }
        };
        let request = &mut s.requests[r as usize];
        // idempotency::finish: only a key still in progress takes an answer.
        let finish = |request: &mut Request| match request.key {
            KeyRow::InProgress { .. } => {
                request.key = KeyRow::Completed;
                true
            }
            _ => false,
        };
        if found {
            // The earlier payout answered again.
            if self.guards.request_key {
                finish(request);
            }
            return;
        }
        if s.balance < 1 {
            if !self.guards.request_key || finish(request) {
                request.refused = true;
            }
            return;
        }
        if self.guards.request_key && !finish(request) {
            return; // finish raises: rolled back
        }
        s.balance -= 1;
        let state = if self.confirm { Created } else { Queued };
        s.payouts.push(PayoutRow {
            request: r,
            state,
            token_expired: false,
            returned: 0,
            confirmed: 0,
        });
        if state == Queued {
            let payout = (s.payouts.len() - 1) as u8;
            s.jobs.push(JobRow {
                payout,
                status: JobStatus::Eligible,
                attempt: 0,
                spent: 0,
                lease_live: false,
            });
        }
    }

    fn claim(&self, s: &mut State, w: u8, j: u8) {
        let job = &mut s.jobs[j as usize];
        job.status = JobStatus::Processing;
        job.attempt += 1;
        job.spent += 1;
        job.lease_live = true;
        let (payout, attempt) = (job.payout, job.attempt);
        let seen = s.payouts[payout as usize].state;
        s.workers[w as usize].job = if seen == Queued {
            Delivery::Claimed { job: j, attempt }
        } else {
            Delivery::Worked {
                job: j,
                attempt,
                seen,
                outcome: Some(Delivered::Nothing),
            }
        };
    }

    fn call(&self, s: &mut State, w: u8, answer: Answer) {
        let Delivery::Claimed { job, attempt } = s.workers[w as usize].job else {
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
        let outcome = match (answer, status) {
            (Answer::AppliedThenTimedOut, _) | (_, None) => None,
            (_, Some(ProviderStatus::Refused)) => Some(Delivered::Refused),
            (_, Some(status)) => Some(Delivered::Word(status)),
        };
        s.workers[w as usize].job = Delivery::Worked {
            job,
            attempt,
            seen: Queued,
            outcome,
        };
    }

    fn record(&self, s: &mut State, w: u8) {
        let Delivery::Worked {
            job,
            attempt,
            seen,
            outcome: Some(delivered),
        } = s.workers[w as usize].job
        else {
            unreachable!("a record follows work")
        };
        s.workers[w as usize].job = Delivery::Idle;
        let row = s.jobs[job as usize];
        if row.status != JobStatus::Processing || row.attempt != attempt {
            return; // the fence refuses a zombie: nothing is written
        }
        let (from, to): (&[PayoutState], PayoutState) = match delivered {
            Delivered::Nothing => (&[], Queued),
            Delivered::Word(ProviderStatus::Pending) => (&[Queued], Sent),
            Delivered::Word(ProviderStatus::Paid) => (&[Queued, Sent], Paid),
            Delivered::Word(ProviderStatus::Returned) => (&[Queued, Sent], Returned),
            Delivered::Word(_) => (&[Queued, Sent], Failed),
            Delivered::Refused => (&[Queued], Failed),
        };
        // Without the conditional update the worker decides from the state
        // it loaded, and writes blind.
        let decides = if self.guards.state_condition {
            !from.is_empty()
        } else {
            from.contains(&seen)
        };
        if decides && self.write(s, row.payout, from, to) == Written::Refused {
            return; // the completion rolls back: the job stays processing
        }
        let row = &mut s.jobs[job as usize];
        row.status = JobStatus::Settled;
        row.lease_live = false;
    }

    fn receive_webhook(&self, s: &mut State, event: u8) {
        let at = s.inflight.iter().position(|e| *e == event).expect("in flight");
        s.inflight.remove(at);
        let (index, returned) = event_parts(event);
        let payment = s.payments[index as usize];
        // The event says what the payment was when it was made: a settle
        // event of a payment returned since said paid.
        let (from, to): (&[PayoutState], PayoutState) = if returned {
            (&[Queued, Sent, Paid], Returned)
        } else if payment.status == ProviderStatus::Failed {
            (&[Queued, Sent], Failed)
        } else {
            (&[Queued, Sent], Paid)
        };
        self.decide(s, payment.payout, from, to, Source::Webhook(event));
    }
}

impl Model for Payouts {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            balance: self.credit,
            requests: vec![
                Request {
                    posted: false,
                    key: KeyRow::Free,
                    refused: false,
                };
                self.requests as usize
            ],
            posts: Vec::new(),
            payouts: Vec::new(),
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
        self.request_actions(state, actions);
        self.payout_actions(state, actions);
        for w in 0..self.workers {
            self.worker_actions(state, w, actions);
        }
        self.environment_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::PostPayout { request } => self.post(&mut s, request),
            Action::Pay { post } => self.pay(&mut s, post),
            Action::KeyLockExpires { request } => {
                s.budget.key_lock_expiries -= 1;
                s.requests[request as usize].key = KeyRow::InProgress { locked: false };
            }
            Action::Redeem { payout } => {
                s.budget.redemptions -= 1;
                self.decide(&mut s, payout, &[Created], Queued, Source::Confirm);
            }
            Action::TokenExpires { payout } => s.payouts[payout as usize].token_expired = true,
            Action::Expire { payout } => self.decide(&mut s, payout, &[Created], Expired, Source::Sweeper),
            Action::Cancel { payout } => {
                s.budget.cancels -= 1;
                self.decide(&mut s, payout, &[Created], Cancelled, Source::Creator);
            }
            Action::ClaimJob { worker, job } => self.claim(&mut s, worker, job),
            Action::CallProvider { worker, answer } => self.call(&mut s, worker, answer),
            Action::RecordDelivery { worker } => self.record(&mut s, worker),
            Action::Snooze { worker } => {
                let Delivery::Worked { job, attempt, .. } = s.workers[worker as usize].job else {
                    unreachable!("a snooze follows work")
                };
                let row = &mut s.jobs[job as usize];
                if row.status == JobStatus::Processing && row.attempt == attempt {
                    row.status = JobStatus::Eligible;
                    row.spent -= 1;
                    row.lease_live = false;
                }
                s.workers[worker as usize].job = Delivery::Idle;
            }
            Action::LeaseExpires { job } => s.jobs[job as usize].lease_live = false,
            Action::Rescue { job } => {
                let row = &mut s.jobs[job as usize];
                row.status = if row.spent >= self.max_attempts {
                    JobStatus::Dead
                } else {
                    JobStatus::Eligible
                };
            }
            Action::ReplayDeadLetter { job } => {
                let row = &mut s.jobs[job as usize];
                row.status = JobStatus::Eligible;
                row.spent = 0;
            }
            Action::ProviderSettles { payment, paid } => {
                if !paid {
                    s.budget.provider_failures -= 1;
                }
                s.payments[payment as usize].status = if paid {
                    ProviderStatus::Paid
                } else {
                    ProviderStatus::Failed
                };
                s.events.resize(2 * s.payments.len(), 0);
                s.inflight.push(event_of(payment, false));
                s.inflight.sort();
            }
            Action::ProviderReturns { payment } => {
                s.budget.returns -= 1;
                s.payments[payment as usize].status = ProviderStatus::Returned;
                s.events.resize(2 * s.payments.len(), 0);
                s.inflight.push(event_of(payment, true));
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
                let payment = Self::payment_of(&s, payout).expect("a payment to look up");
                let (from, to): (&[PayoutState], PayoutState) = match payment.status {
                    ProviderStatus::Paid => (&[Queued, Sent], Paid),
                    ProviderStatus::Returned => (&[Queued, Sent, Paid], Returned),
                    _ => (&[Queued, Sent], Failed),
                };
                self.decide(&mut s, payout, from, to, Source::Poll);
            }
            Action::Write { intent } => {
                let at = s.intents.iter().position(|i| *i == intent).expect("an intent");
                s.intents.remove(at);
                // The read decided; the write is blind (`from` is unused).
                self.commit(&mut s, intent.payout, &[], intent.to, intent.source);
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
                let outstanding = s.payouts.iter().filter(|row| row.returned == 0).count() as i8;
                m.credit == s.balance + outstanding
            }),
            Property::always(property::RETURNED_AT_MOST_ONCE, |_, s: &State| {
                s.payouts.iter().all(|row| row.returned <= 1)
            }),
            Property::always(property::RETURNED_ONLY_UNPAID, |_, s: &State| {
                s.payouts.iter().enumerate().all(|(i, row)| {
                    row.returned == 0
                        || !s
                            .payments
                            .iter()
                            .any(|pay| pay.payout == i as u8 && pay.status == ProviderStatus::Paid)
                })
            }),
            Property::always(property::PAID_AT_MOST_ONCE, |_, s: &State| {
                (0..s.payouts.len() as u8).all(|p| {
                    let applied = s
                        .payments
                        .iter()
                        .filter(|pay| pay.payout == p && pay.status != ProviderStatus::Refused)
                        .count();
                    applied <= 1
                })
            }),
            Property::always(property::REQUEST_ONCE, |m: &Payouts, s: &State| {
                (0..m.requests).all(|r| s.payouts.iter().filter(|p| p.request == r).count() <= 1)
            }),
            Property::always(property::EVENT_AT_MOST_ONCE, |_, s: &State| {
                s.events.iter().all(|n| *n <= 1)
            }),
            Property::eventually(property::EVERY_PAYOUT_ENDS, |m: &Payouts, s: &State| {
                let answered = (0..m.requests).all(|r| s.requests[r as usize].posted && Self::answered(s, r));
                answered
                    && s.posts.is_empty()
                    && s.payouts.iter().enumerate().all(|(p, row)| {
                        let came_back =
                            Self::payment_of(s, p as u8).is_some_and(|pay| pay.status == ProviderStatus::Returned);
                        (row.state == Paid && row.returned == 0 && !came_back)
                            || (row.state.returns_funds() && row.returned >= 1)
                    })
            }),
            Property::sometimes("a payout is paid", |_, s: &State| {
                s.payouts.iter().any(|r| r.state == Paid)
            }),
            Property::sometimes("a payout fails and its funds come back", |_, s: &State| {
                s.payouts.iter().any(|r| r.state == Failed && r.returned == 1)
            }),
        ];
        if self.faults.returns > 0 {
            properties.push(Property::sometimes(
                "a paid payout is returned by its bank and its funds come back",
                |_, s: &State| {
                    s.payouts.iter().enumerate().any(|(p, r)| {
                        r.state == Returned
                            && r.returned == 1
                            && Self::payment_of(s, p as u8).is_some_and(|pay| pay.status == ProviderStatus::Returned)
                    })
                },
            ));
        }
        if self.confirm {
            properties.push(Property::always(property::TOKEN_ONCE, |_, s: &State| {
                s.payouts.iter().all(|row| row.confirmed <= 1)
            }));
            properties.push(Property::sometimes("an unconfirmed payout expires", |_, s: &State| {
                s.payouts.iter().any(|r| r.state == Expired)
            }));
        }
        if self.faults.webhook_duplicates > 0 {
            properties.push(Property::sometimes(
                "a duplicated webhook is answered and ignored",
                |_, s: &State| s.events.contains(&1) && s.budget.webhook_duplicates == 0 && s.inflight.is_empty(),
            ));
        }
        if self.faults.crashes + self.faults.pauses >= self.max_attempts {
            properties.push(Property::sometimes(
                "a dead letter keeps its payout queued, funds held, until replayed",
                |_, s: &State| {
                    s.jobs
                        .iter()
                        .any(|j| j.status == JobStatus::Dead && s.payouts[j.payout as usize].state == Queued)
                },
            ));
        }
        if self.faults.request_repeats > 0 && self.faults.key_lock_expiries > 0 && self.guards.request_key {
            properties.push(Property::sometimes(
                "a repeat takes over a key whose lock passed, and makes no second payout",
                |_, s: &State| {
                    s.budget.request_repeats == 0
                        && s.budget.key_lock_expiries == 0
                        && s.posts.is_empty()
                        && s.payouts.len() == 1
                },
            ));
        }
        properties
    }
}

impl Described for Payouts {
    fn name(&self) -> String {
        let g = self.guards;
        let removed: Vec<&str> = [
            (g.state_condition, "the conditional update"),
            (g.transition_table, "the transitions table"),
            (g.one_return, "the return's key"),
            (g.one_time_token, "the token's condition"),
            (g.event_id, "the unique event id"),
            (g.idempotency_key, "the provider key"),
            (g.request_key, "the request's key claim"),
            (g.unique_request_key, "the unique request key"),
        ]
        .into_iter()
        .filter(|(kept, _)| !kept)
        .map(|(_, name)| name)
        .collect();
        let guards = if removed.is_empty() {
            String::new()
        } else {
            format!(", without {}", removed.join(", "))
        };
        let f = self.faults;
        format!(
            "payouts ({} request(s){}, balance {}, {} delivery worker(s), {} attempt(s); {} crash, {} pause, {} 503, \
             {} applied-then-timed-out, {} refusal, {} failed payment, {} duplicated and {} lost webhook, \
             {} redemptions, {} cancel, {} repeated request, {} key lock passing, {} return{guards})",
            self.requests,
            if self.confirm { " with confirmation" } else { "" },
            self.credit,
            self.workers,
            self.max_attempts,
            f.crashes,
            f.pauses,
            f.provider_unavailable,
            f.applied_then_timed_out,
            f.refusals,
            f.provider_failures,
            f.webhook_duplicates,
            f.webhook_losses,
            f.redemptions,
            f.cancels,
            f.request_repeats,
            f.key_lock_expiries,
            f.returns
        )
    }

    fn describe(&self, s: &State) -> String {
        let requests: Vec<String> = s
            .requests
            .iter()
            .enumerate()
            .filter(|(_, r)| r.posted)
            .map(|(i, r)| {
                let key = match r.key {
                    KeyRow::Free => "",
                    KeyRow::InProgress { locked: true } => " in_progress",
                    KeyRow::InProgress { locked: false } => " in_progress (lock passed)",
                    KeyRow::Completed => " completed",
                };
                let refused = if r.refused { " refused" } else { "" };
                let in_pay = s.posts.iter().filter(|p| p.request == i as u8).count();
                let in_pay = if in_pay > 0 {
                    format!(" {in_pay} in pay()")
                } else {
                    String::new()
                };
                format!("k{i}{key}{refused}{in_pay}")
            })
            .collect();
        let payouts: Vec<String> = s
            .payouts
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let returned = if r.returned > 0 {
                    format!(" returned x{}", r.returned)
                } else {
                    String::new()
                };
                format!("p{i}(k{}) {:?}{returned}", r.request, r.state).to_lowercase()
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
        let inflight: Vec<String> = s.inflight.iter().map(|e| event_name(*e)).collect();
        let mut out = format!(
            "balance {} requests [{}] payouts [{}] jobs [{}] provider [{}] webhooks in flight [{}]",
            s.balance,
            requests.join(", "),
            payouts.join(", "),
            jobs.join(", "),
            payments.join(", "),
            inflight.join(", ")
        );
        if s.events.iter().any(|n| *n > 0) {
            let events: Vec<String> = s
                .events
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(e, n)| format!("{} x{n}", event_name(e as u8)))
                .collect();
            out.push_str(&format!(" events stored [{}]", events.join(", ")));
        }
        if !s.intents.is_empty() {
            let intents: Vec<String> = s
                .intents
                .iter()
                .map(|i| format!("{:?} read p{}: will write {:?}", i.source, i.payout, i.to))
                .collect();
            out.push_str(&format!(" | read, not yet written: [{}]", intents.join(", ")));
        }
        out
    }
}
