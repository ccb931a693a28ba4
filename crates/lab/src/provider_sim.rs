//! `settled provider-sim`: a local payment provider for tests, demos and
//! chaos runs. It stores payments by idempotency key (a repeat returns the
//! first payment and pays nothing), and injects faults on demand: latency,
//! errors before applying, and "applied, then timed out" (the payment is
//! stored, the answer comes too late for the caller).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use settled::money::Amount;
use settled::provider::{Payment, PaymentRequest};

/// Largest request body the simulator reads.
pub const MAX_SIM_BODY_BYTES: usize = 16 * 1024;

/// Faults to inject, changeable at run time with `POST /v1/faults`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Latency added to every call, in milliseconds.
    #[serde(default)]
    pub latency_ms: u64,
    /// Share of new payments answered 503 before anything is applied (0..=1).
    #[serde(default)]
    pub error_rate: f64,
    /// Share of new payments applied and then answered only after
    /// `applied_timeout_ms` (the caller times out first) (0..=1).
    #[serde(default)]
    pub applied_timeout_rate: f64,
    /// How late an "applied, then timed out" answer comes, in milliseconds.
    #[serde(default = "default_applied_timeout_ms")]
    pub applied_timeout_ms: u64,
}

fn default_applied_timeout_ms() -> u64 {
    5_000
}

/// Counters of what the simulator did.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct SimCounters {
    /// Payments applied (one per key).
    pub applied: u64,
    /// Repeats answered with the stored payment.
    pub replayed: u64,
    /// Calls refused with an injected 503.
    pub injected_errors: u64,
    /// Payments applied whose answer was delayed past the caller's timeout.
    pub applied_then_timed_out: u64,
    /// Same key with a different request: refused with 422.
    pub conflicts: u64,
}

struct Sim {
    faults: Faults,
    payments: HashMap<String, (PaymentRequest, Payment)>,
    counters: SimCounters,
    rng: ChaCha8Rng,
}

type Shared = Arc<Mutex<Sim>>;

/// The simulator's HTTP routes.
pub fn router(faults: Faults, seed: u64) -> Router {
    let state: Shared = Arc::new(Mutex::new(Sim {
        faults,
        payments: HashMap::new(),
        counters: SimCounters::default(),
        rng: ChaCha8Rng::seed_from_u64(seed),
    }));
    Router::new()
        .route("/v1/payments", post(pay).get(list))
        .route("/v1/faults", post(set_faults).get(get_faults))
        .route("/v1/counters", get(counters))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_SIM_BODY_BYTES))
        .with_state(state)
}

/// Serves the simulator on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, faults: Faults, seed: u64) -> anyhow::Result<()> {
    axum::serve(listener, router(faults, seed)).await?;
    Ok(())
}

enum Decision {
    Replay(Payment),
    Conflict,
    Fail,
    Apply { payment: Payment, late: Option<Duration> },
}

async fn pay(State(sim): State<Shared>, headers: HeaderMap, Json(request): Json<PaymentRequest>) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key").into_response();
    };
    if Amount::parse_decimal(&request.amount).is_err() {
        return (StatusCode::UNPROCESSABLE_ENTITY, "amount must be a decimal integer").into_response();
    }
    let (decision, latency) = {
        let mut sim = sim.lock().expect("sim lock");
        let latency = Duration::from_millis(sim.faults.latency_ms);
        let decision = if let Some((first, payment)) = sim.payments.get(&key) {
            if first.creator == request.creator && first.amount == request.amount {
                let payment = payment.clone();
                sim.counters.replayed += 1;
                Decision::Replay(payment)
            } else {
                sim.counters.conflicts += 1;
                Decision::Conflict
            }
        } else {
            let roll: f64 = sim.rng.gen();
            if roll < sim.faults.error_rate {
                sim.counters.injected_errors += 1;
                Decision::Fail
            } else {
                let payment = Payment {
                    id: sim.counters.applied + 1,
                    idempotency_key: key.clone(),
                    creator: request.creator.clone(),
                    amount: request.amount.clone(),
                };
                sim.counters.applied += 1;
                sim.payments.insert(key, (request, payment.clone()));
                let late = (roll < sim.faults.error_rate + sim.faults.applied_timeout_rate).then(|| {
                    sim.counters.applied_then_timed_out += 1;
                    Duration::from_millis(sim.faults.applied_timeout_ms)
                });
                Decision::Apply { payment, late }
            }
        };
        (decision, latency)
    };
    tokio::time::sleep(latency).await;
    match decision {
        Decision::Replay(payment) => (StatusCode::OK, Json(payment)).into_response(),
        Decision::Conflict => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency key reused with a different request",
        )
            .into_response(),
        Decision::Fail => (StatusCode::SERVICE_UNAVAILABLE, "injected failure").into_response(),
        Decision::Apply { payment, late } => {
            if let Some(delay) = late {
                tokio::time::sleep(delay).await;
            }
            (StatusCode::CREATED, Json(payment)).into_response()
        }
    }
}

async fn list(State(sim): State<Shared>) -> Json<Vec<Payment>> {
    let sim = sim.lock().expect("sim lock");
    let mut all: Vec<Payment> = sim.payments.values().map(|(_, p)| p.clone()).collect();
    all.sort_by_key(|p| p.id);
    Json(all)
}

async fn set_faults(State(sim): State<Shared>, Json(faults): Json<Faults>) -> Response {
    let rates_ok = (0.0..=1.0).contains(&faults.error_rate)
        && (0.0..=1.0).contains(&faults.applied_timeout_rate)
        && faults.error_rate + faults.applied_timeout_rate <= 1.0;
    if !rates_ok {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            "rates must be within 0..=1 and sum to at most 1",
        )
            .into_response();
    }
    sim.lock().expect("sim lock").faults = faults;
    StatusCode::NO_CONTENT.into_response()
}

async fn get_faults(State(sim): State<Shared>) -> Json<Faults> {
    Json(sim.lock().expect("sim lock").faults)
}

async fn counters(State(sim): State<Shared>) -> Json<SimCounters> {
    Json(sim.lock().expect("sim lock").counters)
}
