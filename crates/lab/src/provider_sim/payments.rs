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

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
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
use settled::provider::{
    EventType, Payment, PaymentRequest, PaymentStatus, WebhookEvent, DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT,
};

use super::{chance, error, lock, webhooks, Shared, Sim};

/// The longest idempotency key, creator or reference the simulator takes.
pub(super) const TEXT_CHARS_MAX: usize = 255;

/// Why a payment fails after acceptance, or is refused: one is picked per key.
const FAILURE_REASONS: [&str; 4] = [
    "account_closed",
    "account_frozen",
    "invalid_account",
    "could_not_process",
];

/// Every payment and every refused key.
#[derive(Default)]
pub(super) struct Ledger {
    /// Keys forgotten so far (their payments kept).
    pub(super) keys_forgotten: u64,
    by_id: BTreeMap<String, Record>,
    id_by_key: HashMap<String, String>,
    refused: HashMap<String, String>,
    payments_made: u64,
    events_made: u64,
}

struct Record {
    request: PaymentRequest,
    payment: Payment,
    /// When the call that created it arrived, in microseconds since the
    /// Unix epoch (before any latency the faults add).
    arrived_us: i64,
}

/// When the call that created a payment arrived (`GET /v1/arrivals`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Arrival {
    /// The payment's idempotency key.
    pub idempotency_key: String,
    /// Microseconds since the Unix epoch, on this machine's clock.
    pub arrived_us: i64,
}

/// How an accepted payment ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fate {
    Paid,
    Failed(String),
}

impl Ledger {
    fn by_key(&self, key: &str) -> Option<&Record> {
        self.id_by_key.get(key).and_then(|id| self.by_id.get(id))
    }

    /// The payment under `key`, unless the key was first used more than
    /// `forget_after_ms` before `now_us` (0: never forgotten): a forgotten
    /// key is dropped, its payment kept.
    fn remembered(&mut self, key: &str, now_us: i64, forget_after_ms: u64) -> Option<&Record> {
        let first_used_us = self.by_key(key)?.arrived_us;
        if forget_after_ms > 0 && now_us - first_used_us > (forget_after_ms as i64).saturating_mul(1_000) {
            self.id_by_key.remove(key);
            self.keys_forgotten += 1;
            return None;
        }
        self.by_key(key)
    }

    /// The payments whose reference is `reference`, in id order.
    fn by_reference(&self, reference: &str) -> Vec<Payment> {
        self.by_id
            .values()
            .filter(|record| record.payment.reference.as_deref() == Some(reference))
            .map(|record| record.payment.clone())
            .collect()
    }

    /// Stores a new pending payment under `key`. Ids rise with each
    /// payment, zero-padded, so their text order is their creation order.
    fn accept(&mut self, key: String, request: PaymentRequest, arrived_us: i64) -> Payment {
        self.payments_made += 1;
        let payment = Payment {
            id: format!("pay_{:012}", self.payments_made),
            idempotency_key: key.clone(),
            creator: request.creator.clone(),
            amount: request.amount.clone(),
            status: PaymentStatus::Pending,
            failure_reason: None,
            reference: request.reference.clone(),
        };
        self.id_by_key.insert(key, payment.id.clone());
        self.by_id.insert(
            payment.id.clone(),
            Record {
                request,
                payment: payment.clone(),
                arrived_us,
            },
        );
        payment
    }

    /// The state machine's one transition: pending to paid or failed.
    /// None (nothing changes) when the payment has already ended, or was
    /// forgotten ([`Ledger::forget`]) before its time came.
    pub(super) fn settle(&mut self, id: &str, fate: Fate, now: i64) -> Option<WebhookEvent> {
        let record = self.by_id.get_mut(id)?;
        let payment = &mut record.payment;
        if payment.status.is_final() {
            return None;
        }
        match fate {
            Fate::Paid => payment.status = PaymentStatus::Paid,
            Fate::Failed(reason) => {
                payment.status = PaymentStatus::Failed;
                payment.failure_reason = Some(reason);
            }
        }
        Some(self.event(id, now))
    }

    /// The event announcing payment `id`'s status now.
    fn event(&mut self, id: &str, now: i64) -> WebhookEvent {
        self.events_made += 1;
        let payment = &self.by_id[id].payment;
        WebhookEvent {
            id: format!("evt_{:012}", self.events_made),
            r#type: EventType::for_status(payment.status).expect("a payment past pending"),
            created: now,
            data: payment.clone(),
        }
    }

    /// A paid payment's bank sends it back: paid to returned (or to
    /// failed, as a provider without a returned status says), with `reason`.
    /// Err names why not (no such payment, or it is not paid).
    pub(super) fn take_back(
        &mut self,
        id: &str,
        reason: String,
        as_failed: bool,
        now: i64,
    ) -> Result<WebhookEvent, String> {
        let Some(record) = self.by_id.get_mut(id) else {
            return Err(format!("no payment {id}"));
        };
        let payment = &mut record.payment;
        if payment.status != PaymentStatus::Paid {
            return Err(format!(
                "payment {id} is {}: only a paid payment is returned",
                payment.status
            ));
        }
        payment.status = if as_failed {
            PaymentStatus::Failed
        } else {
            PaymentStatus::Returned
        };
        payment.failure_reason = Some(reason);
        Ok(self.event(id, now))
    }

    /// Loses payment `id`: gone from look-ups and pages, its key free
    /// again (a new request under it makes a new payment). None when there
    /// is no such payment.
    pub(super) fn forget(&mut self, id: &str) -> Option<Payment> {
        let record = self.by_id.remove(id)?;
        self.id_by_key.remove(&record.payment.idempotency_key);
        Some(record.payment)
    }

    /// Payment `id`, for a change outside the state machine ([`super::tamper`]).
    pub(super) fn payment_mut(&mut self, id: &str) -> Option<&mut Payment> {
        self.by_id.get_mut(id).map(|record| &mut record.payment)
    }

    /// Every payment's key and the arrival of the call that created it.
    pub(super) fn arrivals(&self) -> Vec<Arrival> {
        self.by_id
            .values()
            .map(|record| Arrival {
                idempotency_key: record.payment.idempotency_key.clone(),
                arrived_us: record.arrived_us,
            })
            .collect()
    }

    fn page(&self, after: Option<&str>, limit: usize) -> Vec<Payment> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.by_id
            .range::<str, _>((start, Bound::Unbounded))
            .take(limit)
            .map(|(_, record)| record.payment.clone())
            .collect()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(amount: &str) -> PaymentRequest {
        PaymentRequest {
            creator: "0xabc".into(),
            amount: amount.into(),
            reference: None,
        }
    }

    #[test]
    fn a_final_state_never_changes() {
        let mut ledger = Ledger::default();
        let paid = ledger.accept("k1".into(), request("5"), 0).id;
        let failed = ledger.accept("k2".into(), request("6"), 0).id;
        let event = ledger.settle(&paid, Fate::Paid, 10).unwrap();
        assert_eq!(
            (event.r#type, event.data.status),
            (EventType::PaymentPaid, PaymentStatus::Paid)
        );
        let event = ledger
            .settle(&failed, Fate::Failed("account_closed".into()), 11)
            .unwrap();
        assert_eq!(event.data.failure_reason.as_deref(), Some("account_closed"));
        assert_ne!(event.id, "evt_000000000001", "each event has its own id");
        assert_eq!(ledger.settle(&paid, Fate::Failed("late".into()), 12), None);
        assert_eq!(ledger.settle(&failed, Fate::Paid, 12), None);
        assert_eq!(ledger.by_key("k1").unwrap().payment.status, PaymentStatus::Paid);
        let failed = &ledger.by_key("k2").unwrap().payment;
        assert_eq!(
            (failed.status, failed.failure_reason.as_deref()),
            (PaymentStatus::Failed, Some("account_closed"))
        );
    }

    #[test]
    fn only_a_paid_payment_is_returned_and_a_return_never_changes() {
        let mut ledger = Ledger::default();
        let paid = ledger.accept("k1".into(), request("5"), 0).id;
        let pending = ledger.accept("k2".into(), request("6"), 0).id;
        ledger.settle(&paid, Fate::Paid, 1).unwrap();
        assert!(ledger.take_back(&pending, "bank".into(), false, 2).is_err(), "pending");
        let event = ledger.take_back(&paid, "account_closed".into(), false, 2).unwrap();
        assert_eq!(
            (event.r#type, event.data.status, event.data.failure_reason.as_deref()),
            (
                EventType::PaymentReturned,
                PaymentStatus::Returned,
                Some("account_closed")
            )
        );
        assert!(
            ledger.take_back(&paid, "again".into(), false, 3).is_err(),
            "returned once"
        );
        assert_eq!(ledger.settle(&paid, Fate::Paid, 3), None, "never paid again");
        // A provider without a returned status says failed.
        ledger.settle(&pending, Fate::Paid, 4).unwrap();
        let event = ledger.take_back(&pending, "bank".into(), true, 5).unwrap();
        assert_eq!(
            (event.r#type, event.data.status),
            (EventType::PaymentFailed, PaymentStatus::Failed)
        );
    }

    #[test]
    fn a_forgotten_key_is_free_again_and_its_payment_is_still_found_by_reference() {
        let mut ledger = Ledger::default();
        let with_reference = PaymentRequest {
            reference: Some("ref-1".into()),
            ..request("5")
        };
        let first = ledger.accept("k".into(), with_reference.clone(), 1_000_000).id;
        assert!(ledger.remembered("k", 1_500_000, 1_000).is_some(), "within the window");
        assert!(ledger.remembered("k", 1_500_000, 0).is_some(), "0 keeps keys for ever");
        assert!(ledger.remembered("k", 2_000_001, 1_000).is_none(), "forgotten");
        assert_eq!(ledger.keys_forgotten, 1);
        let found: Vec<String> = ledger.by_reference("ref-1").into_iter().map(|p| p.id).collect();
        assert_eq!(found, std::slice::from_ref(&first));
        let second = ledger.accept("k".into(), with_reference, 2_000_002).id;
        let found: Vec<String> = ledger.by_reference("ref-1").into_iter().map(|p| p.id).collect();
        assert_eq!(found, [first, second], "a new payment under the forgotten key");
        assert!(ledger.by_reference("ref-2").is_empty());
    }

    #[test]
    fn pages_follow_id_order_after_the_cursor() {
        let mut ledger = Ledger::default();
        let ids: Vec<String> = (0..12)
            .map(|i| ledger.accept(format!("k{i}"), request("1"), i).id)
            .collect();
        assert_eq!(ids[11], "pay_000000000012");
        let page = |after: Option<&str>, limit| -> Vec<String> {
            ledger.page(after, limit).into_iter().map(|p| p.id).collect()
        };
        assert_eq!(page(None, 5), ids[..5]);
        assert_eq!(page(Some(&ids[4]), 5), ids[5..10]);
        assert_eq!(page(Some(&ids[9]), 5), ids[10..]);
        assert!(page(Some(&ids[11]), 5).is_empty());
        assert_eq!(page(Some("pay_"), 2), ids[..2], "any text is a cursor");
    }

    #[test]
    fn a_create_request_is_checked_and_its_amount_made_canonical() {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", "k-1".parse().unwrap());
        let (key, parsed) = parse_create(&headers, br#"{"creator":"0xabc","amount":"007"}"#).unwrap();
        assert_eq!((key.as_str(), parsed), ("k-1", request("7")));
        for (body, why) in [
            (r#"{"creator":"0xabc","amount":""}"#, "amount is empty"),
            (r#"{"creator":"0xabc","amount":"1.5"}"#, "amount must be a whole number"),
            (r#"{"creator":"0xabc","amount":7}"#, "body: invalid type"),
            (r#"{"creator":"","amount":"7"}"#, "creator must be"),
            (
                r#"{"creator":"0xabc","amount":"7","memo":"x"}"#,
                "body: unknown field `memo`",
            ),
        ] {
            let error = parse_create(&headers, body.as_bytes()).unwrap_err();
            assert!(error.starts_with(why), "{body}: {error}");
        }
        assert!(parse_create(&HeaderMap::new(), b"{}")
            .unwrap_err()
            .contains("missing Idempotency-Key"));
    }
}
