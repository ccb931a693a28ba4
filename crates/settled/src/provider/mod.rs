//! The provider protocol, settled's side (docs/api.md, "The provider
//! protocol"): the payment and event types, the errors a call can end in,
//! the [`PayoutProvider`] trait the money path calls, its HTTP client
//! ([`HttpProvider`], in `http.rs`) and webhook signatures (`signature.rs`).
//!
//! Every payment is sent under an idempotency key derived from what is paid
//! (for a settlement, [`payout_key`] of the period and the creator), so a
//! retry, a crash or a zombie worker can never make the provider pay twice.
//! This module never decides what a payment means for a balance: it only
//! says what the provider answered.

mod http;
pub mod signature;

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::money::Amount;
use crate::period::Period;

pub use http::{HttpProvider, DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT};

/// Default time a provider call may take before it counts as timed out.
pub(crate) const DEFAULT_PROVIDER_TIMEOUT_MS: u64 = 2_000;

/// The idempotency key of a creator's payout for a period. Stable across
/// retries, workers and restarts.
pub fn payout_key(period: Period, creator: &str) -> String {
    format!("settled:{period}:{creator}")
}

/// Where a payment is in the provider's own state machine: `pending`, then
/// `paid` or `failed`; a paid payment may still be `returned` (its bank
/// sent the money back), days or weeks later. `failed` and `returned`
/// never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PaymentStatus {
    /// Accepted, not yet paid or failed.
    Pending,
    /// Paid (it may still be returned).
    Paid,
    /// Failed after acceptance (see `failure_reason`): final; nothing was
    /// paid. A provider without a returned status says `failed` of a paid
    /// payment that came back: settled takes that as a return.
    Failed,
    /// Paid, then returned (see `failure_reason`): final; nothing was paid
    /// for good.
    Returned,
}

impl PaymentStatus {
    /// Every status, in the order a payment goes through them.
    #[cfg(test)]
    pub(crate) const ALL: [PaymentStatus; 4] = [
        PaymentStatus::Pending,
        PaymentStatus::Paid,
        PaymentStatus::Failed,
        PaymentStatus::Returned,
    ];

    /// True once the payment is past `pending` (paid, failed or returned).
    pub fn is_final(self) -> bool {
        self != PaymentStatus::Pending
    }

    /// True when nothing went out for good: failed, or returned.
    pub fn is_unpaid_ending(self) -> bool {
        matches!(self, PaymentStatus::Failed | PaymentStatus::Returned)
    }

    /// The protocol's name of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::Pending => "pending",
            PaymentStatus::Paid => "paid",
            PaymentStatus::Failed => "failed",
            PaymentStatus::Returned => "returned",
        }
    }
}

impl std::fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One payment as the provider records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Payment {
    /// The provider's id; ids sort in the order the provider lists them.
    pub id: String,
    /// The idempotency key it was created under.
    pub idempotency_key: String,
    /// Who is paid.
    pub creator: String,
    /// How much, in base units (a decimal string: amounts exceed 2^53).
    pub amount: String,
    /// Where the payment is.
    pub status: PaymentStatus,
    /// Why it failed, or why it was returned.
    #[serde(default)]
    pub failure_reason: Option<String>,
    /// The caller's reference, as sent.
    #[serde(default)]
    pub reference: Option<String>,
}

/// The body of `POST /v1/payments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentRequest {
    /// Who to pay.
    pub creator: String,
    /// How much, in base units (a decimal string).
    pub amount: String,
    /// The caller's reference for the payment (settled sends its payout's
    /// provider key, or id for a payout keyed by its id).
    #[serde(default)]
    pub reference: Option<String>,
}

/// The type of a webhook event: the state a payment reached past `pending`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum EventType {
    /// `payment.paid`.
    #[serde(rename = "payment.paid")]
    PaymentPaid,
    /// `payment.failed`.
    #[serde(rename = "payment.failed")]
    PaymentFailed,
    /// `payment.returned`: a paid payment came back.
    #[serde(rename = "payment.returned")]
    PaymentReturned,
}

impl EventType {
    /// The event announcing that a payment reached `status`; none for `pending`.
    pub fn for_status(status: PaymentStatus) -> Option<EventType> {
        match status {
            PaymentStatus::Pending => None,
            PaymentStatus::Paid => Some(EventType::PaymentPaid),
            PaymentStatus::Failed => Some(EventType::PaymentFailed),
            PaymentStatus::Returned => Some(EventType::PaymentReturned),
        }
    }

    /// The event's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::PaymentPaid => "payment.paid",
            EventType::PaymentFailed => "payment.failed",
            EventType::PaymentReturned => "payment.returned",
        }
    }

    /// The status the event announces.
    pub fn status(self) -> PaymentStatus {
        match self {
            EventType::PaymentPaid => PaymentStatus::Paid,
            EventType::PaymentFailed => PaymentStatus::Failed,
            EventType::PaymentReturned => PaymentStatus::Returned,
        }
    }
}

/// The body the provider POSTs to `POST /v1/provider-events`, signed in the
/// `Provider-Signature` header ([`signature`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookEvent {
    /// The event's id: the same id when the provider sends it again.
    pub id: String,
    /// What happened.
    pub r#type: EventType,
    /// When the provider made the event (unix seconds).
    pub created: i64,
    /// The payment as it was when the event was made.
    pub data: Payment,
}

/// Why a provider call did not give an answer to act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// A 5xx, a redirect or another status the protocol does not use, a
    /// timeout, a connection error, an unreadable answer or one longer than
    /// its cap: the payment may or may not exist; retry with the same key.
    #[error("provider unavailable or timed out: {0}")]
    Transient(String),
    /// 429: retry with the same key after `retry_after` (from `Retry-After`,
    /// `DEFAULT_RETRY_AFTER` when absent or
    /// unreadable).
    #[error("provider rate limited the call: retry after {retry_after:?}")]
    RateLimited {
        /// How long the provider asked to wait.
        retry_after: Duration,
    },
    /// Any other 4xx (the provider will never pay this request), or a
    /// request that could not be built and so was never sent.
    #[error("provider refused the payment: {0}")]
    Refused(String),
    /// 422: the key was used before with a different body.
    #[error("provider has this idempotency key for a different payment: {0}")]
    KeyConflict(String),
}

/// A payment provider, as the money path calls it.
pub trait PayoutProvider: Send + Sync + 'static {
    /// `POST /v1/payments` under `key`: `Ok((payment, created))`, where
    /// `created` is true for a new payment (201) and false for a replay of
    /// the first one (200), which pays nothing more.
    fn pay(
        &self,
        key: &str,
        creator: &str,
        amount: Amount,
        reference: Option<&str>,
    ) -> impl Future<Output = Result<(Payment, bool), ProviderError>> + Send;

    /// `GET /v1/payments?idempotency_key=K`: the payment made under `key`,
    /// or None when the provider has none (404).
    fn lookup(&self, key: &str) -> impl Future<Output = Result<Option<Payment>, ProviderError>> + Send;

    /// `GET /v1/payments?reference=R`: every payment the provider made with
    /// `reference` (none: it certainly has none), whatever became of the
    /// keys they were made under. `Err(Refused)`: the provider cannot say.
    fn find_by_reference(&self, reference: &str) -> impl Future<Output = Result<Vec<Payment>, ProviderError>> + Send;

    /// The same provider, passing on `traceparent` (the W3C trace context
    /// of the work it is called for) where it can; by default nowhere.
    fn with_traceparent(&self, traceparent: Option<&str>) -> Self
    where
        Self: Sized + Clone,
    {
        let _ = traceparent;
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_event_types_have_the_protocol_names() {
        let statuses: Vec<PaymentStatus> = serde_json::from_str(r#"["pending","paid","failed","returned"]"#).unwrap();
        assert_eq!(statuses, PaymentStatus::ALL);
        assert!(serde_json::from_str::<PaymentStatus>(r#""in_transit""#).is_err());
        let types: Vec<EventType> =
            serde_json::from_str(r#"["payment.paid","payment.failed","payment.returned"]"#).unwrap();
        assert_eq!(
            types,
            [
                EventType::PaymentPaid,
                EventType::PaymentFailed,
                EventType::PaymentReturned
            ]
        );
        for status in statuses {
            assert_eq!(
                EventType::for_status(status).map(EventType::status),
                status.is_final().then_some(status)
            );
        }
    }

    #[test]
    fn a_payment_without_its_optional_fields_reads() {
        let payment: Payment = serde_json::from_str(
            r#"{"id":"pay_1","idempotency_key":"k","creator":"c","amount":"10","status":"pending"}"#,
        )
        .unwrap();
        assert_eq!((payment.failure_reason, payment.reference), (None, None));
    }
}
