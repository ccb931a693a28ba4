//! What can happen: each action names the function and the statement it
//! models; and how the provider answers a create.

use std::fmt;

use super::state::{event_name, event_of, Intent, Post};
use crate::signal::Signal;

/// What can happen. Each action names the function and the statement it
/// models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `payouts::create` (api/payouts/create.rs): `idempotency::begin` inserts
    /// the key `in_progress`, or takes over one whose `locked_until` passed;
    /// otherwise 409 (in progress) or the stored answer. A repeat is the
    /// client sending the same key again.
    PostPayout {
        /// The request.
        request: u8,
    },
    /// `pay()` (api/payouts/create.rs), one transaction: `SELECT .. FROM payouts
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
    /// `confirm_in_tx` (api/payouts/confirm.rs), one transaction: `redeem_in` and
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
    /// `payouts::cancel` (api/payouts/confirm.rs): `move_payout(id, [created],
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
    /// A signal to a delivery worker: killed, stopped, continued.
    Signal {
        /// The worker.
        worker: u8,
        /// The signal.
        signal: Signal,
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
            Action::Signal { worker, signal } => write!(f, "w{worker} {signal}"),
        }
    }
}
