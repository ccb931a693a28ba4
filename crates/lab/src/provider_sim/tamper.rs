//! The simulator's records going wrong, on demand, for reconciliation
//! tests and drills: `DELETE /v1/payments/{id}` loses a payment (the
//! provider forgets it; its key is free again), `PATCH /v1/payments/{id}`
//! changes what the provider says of it (`amount`, `creator`, `status`,
//! `failure_reason`, `reference`), outside the payment state machine: a
//! paid payment can be made failed, or the reverse. Neither sends a
//! webhook, and neither is part of the provider protocol: a real provider
//! has no such calls; these stand in for its mistakes.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use settled::money::Amount;
use settled::provider::PaymentStatus;

use super::payments::TEXT_CHARS_MAX;
use super::{error, lock, Shared};

/// What a `PATCH /v1/payments/{id}` changes: each field given replaces the
/// payment's, the others stay.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Alteration {
    amount: Option<String>,
    creator: Option<String>,
    status: Option<PaymentStatus>,
    /// `null` clears it.
    #[serde(default, deserialize_with = "present")]
    failure_reason: Option<Option<String>>,
    /// `null` clears it.
    #[serde(default, deserialize_with = "present")]
    reference: Option<Option<String>>,
}

/// A field that is present, even as `null` (absent stays None).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl Alteration {
    /// Checks the new values as `POST /v1/payments` checks a request's; the
    /// amount comes back written canonically.
    fn checked(mut self) -> Result<Alteration, String> {
        if let Some(amount) = &self.amount {
            self.amount = Some(
                Amount::parse_decimal(amount)
                    .map_err(|e| format!("amount {e}"))?
                    .to_string(),
            );
        }
        let long = |text: &Option<String>| text.as_ref().is_some_and(|t| t.chars().count() > TEXT_CHARS_MAX);
        if self.creator.as_ref().is_some_and(|c| c.is_empty()) || long(&self.creator) {
            return Err(format!("creator must be 1..={TEXT_CHARS_MAX} characters"));
        }
        if self.failure_reason.as_ref().is_some_and(long) || self.reference.as_ref().is_some_and(long) {
            return Err(format!(
                "failure_reason and reference must be at most {TEXT_CHARS_MAX} characters"
            ));
        }
        Ok(self)
    }
}

/// `DELETE /v1/payments/{id}`: 200 with the payment forgotten, or 404.
pub(super) async fn forget(State(sim): State<Shared>, Path(id): Path<String>) -> Response {
    match lock(&sim).ledger.forget(&id) {
        Some(payment) => Json(payment).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no payment {id}")),
    }
}

/// `PATCH /v1/payments/{id}`: 200 with the payment as it now reads, 400
/// for a body that is not an alteration, 404 for no such payment.
pub(super) async fn alter(State(sim): State<Shared>, Path(id): Path<String>, body: Bytes) -> Response {
    let change = match serde_json::from_slice::<Alteration>(&body)
        .map_err(|e| format!("body: {e}"))
        .and_then(Alteration::checked)
    {
        Ok(change) => change,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let mut state = lock(&sim);
    let Some(payment) = state.ledger.payment_mut(&id) else {
        return error(StatusCode::NOT_FOUND, format!("no payment {id}"));
    };
    if let Some(amount) = change.amount {
        payment.amount = amount;
    }
    if let Some(creator) = change.creator {
        payment.creator = creator;
    }
    if let Some(status) = change.status {
        payment.status = status;
    }
    if let Some(reason) = change.failure_reason {
        payment.failure_reason = reason;
    }
    if let Some(reference) = change.reference {
        payment.reference = reference;
    }
    Json(payment.clone()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alteration_names_what_it_changes_and_is_checked() {
        let change: Alteration =
            serde_json::from_str(r#"{"amount":"0070","status":"failed","failure_reason":null}"#).unwrap();
        let change = change.checked().unwrap();
        assert_eq!(change.amount.as_deref(), Some("70"));
        assert_eq!(change.status, Some(PaymentStatus::Failed));
        assert_eq!(change.failure_reason, Some(None), "null clears");
        assert_eq!(change.reference, None, "absent stays");
        for (body, why) in [
            (r#"{"amount":"1.5"}"#, "amount"),
            (r#"{"creator":""}"#, "creator must be"),
            (r#"{"memo":"x"}"#, "unknown field"),
        ] {
            let error = serde_json::from_str::<Alteration>(body)
                .map_err(|e| e.to_string())
                .and_then(Alteration::checked)
                .unwrap_err();
            assert!(error.contains(why), "{body}: {error}");
        }
    }
}
