//! The simulator's payments: `POST /v1/payments` (201 new, 200 replay, 422
//! for another body under a key, a refusal that stays the key's answer),
//! `GET /v1/payments` (by idempotency key, by reference, or a page in id
//! order), and the provider's own state machine: a payment is accepted
//! `pending` and ends `paid` or `failed` once, after `settle_delay_ms`; a
//! paid payment may be returned later (`return_rate`, `return_delay_ms`,
//! or `POST /v1/payments/{id}/return`), and `failed` and `returned` never
//! change. Keys may be forgotten after a window (`forget_keys_after_ms`),
//! as real providers prune them: a create under a forgotten key is a new
//! payment.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rand::Rng;
use serde::Deserialize;

use settled::money::Amount;
use settled::provider::{EventType, Payment, PaymentRequest, DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT};

use super::{chance, error, lock, webhooks, Shared, Sim};

mod ledger;
#[cfg(test)]
mod tests;

pub use ledger::Arrival;
pub(super) use ledger::{Fate, Ledger};

/// The longest idempotency key, creator or reference the simulator takes.
pub(super) const TEXT_CHARS_MAX: usize = 255;

/// Why a payment fails after acceptance, or is refused: one is picked per key.
const FAILURE_REASONS: [&str; 4] = [
    "account_closed",
    "account_frozen",
    "invalid_account",
    "could_not_process",
];

enum Decision {
    RateLimited(u64),
    Refused(String),
    Replay(Payment),
    Conflict,
    Unavailable,
    Created {
        payment: Payment,
        late: Option<Duration>,
        fate: Fate,
        settle_after: Duration,
    },
}

/// `POST /v1/payments`.
pub(super) async fn create(State(sim): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let arrived_us = unix_now_us();
    let (key, request) = match parse_create(&headers, &body) {
        Ok(parsed) => parsed,
        Err(why) => {
            lock(&sim).counters.bad_requests += 1;
            return error(StatusCode::BAD_REQUEST, why);
        }
    };
    let (decision, latency) = {
        let mut state = lock(&sim);
        (
            decide(&mut state, key, request, arrived_us),
            Duration::from_millis(state.faults.latency_ms),
        )
    };
    // Scheduled before any wait: a caller that gives up (its timeout, or
    // its process killed) drops this handler, and an accepted payment
    // must still end.
    if let Decision::Created {
        payment,
        fate,
        settle_after,
        ..
    } = &decision
    {
        tokio::spawn(settle_later(
            sim.clone(),
            payment.id.clone(),
            fate.clone(),
            *settle_after,
        ));
    }
    tokio::time::sleep(latency).await;
    match decision {
        Decision::RateLimited(secs) => rate_limited(secs),
        Decision::Refused(reason) => error(StatusCode::PAYMENT_REQUIRED, format!("payment refused: {reason}")),
        Decision::Replay(payment) => (StatusCode::OK, Json(payment)).into_response(),
        Decision::Conflict => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was used with a different body",
        ),
        Decision::Unavailable => error(StatusCode::SERVICE_UNAVAILABLE, "injected failure"),
        Decision::Created { payment, late, .. } => {
            if let Some(late) = late {
                tokio::time::sleep(late).await;
            }
            (StatusCode::CREATED, Json(payment)).into_response()
        }
    }
}

/// One roll per call decides among 429, 503 (new keys only) and "applied,
/// then answered late"; a new key's refusal and fate are its own rolls.
fn decide(sim: &mut Sim, key: String, request: PaymentRequest, arrived_us: i64) -> Decision {
    let roll: f64 = sim.rng.gen();
    let faults = sim.faults;
    if roll < faults.rate_limit_rate {
        sim.counters.rate_limited += 1;
        return Decision::RateLimited(faults.retry_after_secs);
    }
    if let Some(reason) = sim.ledger.refused.get(&key) {
        sim.counters.refused += 1;
        return Decision::Refused(reason.clone());
    }
    let forget_after_ms = faults.forget_keys_after_ms;
    if let Some(record) = sim.ledger.remembered(&key, arrived_us, forget_after_ms) {
        return if record.request == request {
            sim.counters.replayed += 1;
            Decision::Replay(record.payment.clone())
        } else {
            sim.counters.conflicts += 1;
            Decision::Conflict
        };
    }
    if roll < faults.rate_limit_rate + faults.error_rate {
        sim.counters.injected_errors += 1;
        return Decision::Unavailable;
    }
    if chance(sim.seed, "refuse", &key) < faults.refusal_rate {
        let reason = reason_for(sim.seed, &key).to_string();
        sim.ledger.refused.insert(key, reason.clone());
        sim.counters.refused += 1;
        return Decision::Refused(reason);
    }
    let fate = if chance(sim.seed, "fail", &key) < faults.failure_rate {
        Fate::Failed(reason_for(sim.seed, &key).to_string())
    } else {
        Fate::Paid
    };
    let payment = sim.ledger.accept(key, request, arrived_us);
    sim.counters.applied += 1;
    let late = (roll < faults.rate_limit_rate + faults.error_rate + faults.applied_timeout_rate).then(|| {
        sim.counters.applied_then_timed_out += 1;
        Duration::from_millis(faults.applied_timeout_ms)
    });
    Decision::Created {
        payment,
        late,
        fate,
        settle_after: Duration::from_millis(faults.settle_delay_ms),
    }
}

fn reason_for(seed: u64, key: &str) -> &'static str {
    let pick = chance(seed, "reason", key) * FAILURE_REASONS.len() as f64;
    FAILURE_REASONS[(pick as usize).min(FAILURE_REASONS.len() - 1)]
}

async fn settle_later(sim: Shared, id: String, fate: Fate, after: Duration) {
    tokio::time::sleep(after).await;
    let (event, returned_after) = {
        let mut state = lock(&sim);
        let Some(event) = state.ledger.settle(&id, fate, unix_now()) else {
            return;
        };
        let paid = event.r#type == EventType::PaymentPaid;
        if paid {
            state.counters.paid += 1;
        } else {
            state.counters.failed += 1;
        }
        state.counters.events += 1;
        let returned = paid && chance(state.seed, "return", &event.data.idempotency_key) < state.faults.return_rate;
        (
            event,
            returned.then(|| Duration::from_millis(state.faults.return_delay_ms)),
        )
    };
    webhooks::dispatch(&sim, event);
    if let Some(after) = returned_after {
        tokio::time::sleep(after).await;
        let reason = "returned_by_bank".to_string();
        // A payment returned by hand meanwhile is not paid any more: nothing.
        let _ = take_back(&sim, &id, reason);
    }
}

/// Returns paid payment `id` now (its webhook dispatched): the payment as
/// it reads after, or why not.
fn take_back(sim: &Shared, id: &str, reason: String) -> Result<Payment, String> {
    let event = {
        let mut state = lock(sim);
        let as_failed = state.faults.returns_as_failed;
        let event = state.ledger.take_back(id, reason, as_failed, unix_now())?;
        state.counters.returned += 1;
        state.counters.events += 1;
        event
    };
    let payment = event.data.clone();
    webhooks::dispatch(sim, event);
    Ok(payment)
}

/// The body of `POST /v1/payments/{id}/return`: why (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReturnRequest {
    reason: Option<String>,
}

/// `POST /v1/payments/{id}/return`: the bank sends paid payment `id` back
/// now. 200 with the payment as it now reads (`returned`, or `failed` with
/// `returns_as_failed`), 409 when it is not paid, 404 for no such payment.
pub(super) async fn return_payment(State(sim): State<Shared>, Path(id): Path<String>, body: Bytes) -> Response {
    let request: ReturnRequest = if body.is_empty() {
        ReturnRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(request) => request,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("body: {e}")),
        }
    };
    let reason = request.reason.unwrap_or_else(|| "returned_by_bank".into());
    if reason.is_empty() || reason.chars().count() > TEXT_CHARS_MAX {
        return error(
            StatusCode::BAD_REQUEST,
            format!("reason must be 1..={TEXT_CHARS_MAX} characters"),
        );
    }
    match take_back(&sim, &id, reason) {
        Ok(payment) => Json(payment).into_response(),
        Err(why) if why.starts_with("no payment") => error(StatusCode::NOT_FOUND, why),
        Err(why) => error(StatusCode::CONFLICT, why),
    }
}

pub(super) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn unix_now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// `GET /v1/arrivals`: when each payment's creating call arrived, for
/// measuring the time from a payout's acceptance to its provider call.
pub(super) async fn arrivals(State(sim): State<Shared>) -> Json<Vec<Arrival>> {
    Json(lock(&sim).ledger.arrivals())
}

/// The key (1..=255 visible ASCII characters) and the body, its amount
/// written canonically so that "007" and "7" are one request.
fn parse_create(headers: &HeaderMap, body: &[u8]) -> Result<(String, PaymentRequest), String> {
    let mut keys = headers.get_all("idempotency-key").iter();
    let key = match (keys.next(), keys.next()) {
        (None, _) => return Err("missing Idempotency-Key".into()),
        (Some(_), Some(_)) => return Err("more than one Idempotency-Key".into()),
        (Some(value), None) => value.to_str().map_err(|_| "Idempotency-Key must be visible ASCII")?,
    };
    if key.is_empty() || key.len() > TEXT_CHARS_MAX {
        return Err(format!("Idempotency-Key must be 1..={TEXT_CHARS_MAX} characters"));
    }
    let mut request: PaymentRequest = serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
    // Zero is an amount: a settlement pays a creator whose reward rounds to nothing.
    let amount = Amount::parse_decimal(&request.amount).map_err(|e| format!("amount {e}"))?;
    request.amount = amount.to_string();
    if request.creator.is_empty() || request.creator.chars().count() > TEXT_CHARS_MAX {
        return Err(format!("creator must be 1..={TEXT_CHARS_MAX} characters"));
    }
    if request
        .reference
        .as_ref()
        .is_some_and(|r| r.chars().count() > TEXT_CHARS_MAX)
    {
        return Err(format!("reference must be at most {TEXT_CHARS_MAX} characters"));
    }
    Ok((key.to_string(), request))
}

fn rate_limited(retry_after_secs: u64) -> Response {
    let mut response = error(StatusCode::TOO_MANY_REQUESTS, "rate limited");
    response.headers_mut().insert(RETRY_AFTER, retry_after_secs.into());
    response
}

/// The query of `GET /v1/payments`: `idempotency_key` alone, `reference`
/// alone, or a page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PaymentsQuery {
    idempotency_key: Option<String>,
    reference: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

/// `GET /v1/payments?idempotency_key=K` (200 or 404),
/// `GET /v1/payments?reference=R` (every payment with that reference, an
/// array, empty when none) or `GET /v1/payments?after=ID&limit=N` (a page
/// in id order, an array).
pub(super) async fn get(State(sim): State<Shared>, query: Result<Query<PaymentsQuery>, QueryRejection>) -> Response {
    let query = match query.map_err(|e| e.body_text()).and_then(|Query(q)| checked(q)) {
        Ok(query) => query,
        Err(why) => {
            lock(&sim).counters.bad_requests += 1;
            return error(StatusCode::BAD_REQUEST, why);
        }
    };
    let (answer, latency) = {
        let mut state = lock(&sim);
        (read(&mut state, query), Duration::from_millis(state.faults.latency_ms))
    };
    tokio::time::sleep(latency).await;
    answer
}

enum Read {
    Lookup(String),
    ByReference(String),
    Page { after: Option<String>, limit: usize },
}

fn checked(query: PaymentsQuery) -> Result<Read, String> {
    match query {
        PaymentsQuery {
            idempotency_key: Some(key),
            reference: None,
            after: None,
            limit: None,
        } => Ok(Read::Lookup(key)),
        PaymentsQuery {
            idempotency_key: Some(_),
            ..
        } => Err("idempotency_key looks up one payment: give it without reference, after or limit".into()),
        PaymentsQuery {
            reference: Some(reference),
            after: None,
            limit: None,
            ..
        } => Ok(Read::ByReference(reference)),
        PaymentsQuery { reference: Some(_), .. } => {
            Err("reference looks up the payments made for it: give it without after or limit".into())
        }
        PaymentsQuery { after, limit, .. } => {
            let limit = limit.unwrap_or(DEFAULT_PAGE_LIMIT);
            if !(1..=MAX_PAGE_LIMIT).contains(&limit) {
                return Err(format!("limit must be within 1..={MAX_PAGE_LIMIT}"));
            }
            Ok(Read::Page {
                after,
                limit: limit as usize,
            })
        }
    }
}

fn read(sim: &mut Sim, read: Read) -> Response {
    if sim.rng.gen::<f64>() < sim.faults.rate_limit_rate {
        sim.counters.rate_limited += 1;
        return rate_limited(sim.faults.retry_after_secs);
    }
    match read {
        Read::Lookup(key) => {
            sim.counters.lookups += 1;
            let forget_after_ms = sim.faults.forget_keys_after_ms;
            match sim.ledger.remembered(&key, unix_now_us(), forget_after_ms) {
                Some(record) => Json(record.payment.clone()).into_response(),
                None => error(StatusCode::NOT_FOUND, "no payment under this idempotency key"),
            }
        }
        Read::ByReference(reference) => {
            sim.counters.reference_lookups += 1;
            if sim.faults.no_reference_lookup {
                return error(
                    StatusCode::BAD_REQUEST,
                    "this provider cannot look payments up by reference",
                );
            }
            Json(sim.ledger.by_reference(&reference)).into_response()
        }
        Read::Page { after, limit } => Json(sim.ledger.page(after.as_deref(), limit)).into_response(),
    }
}
