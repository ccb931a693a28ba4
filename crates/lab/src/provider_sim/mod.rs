//! `settled provider-sim`: a payment provider that speaks the provider
//! protocol (docs/api.md, "The provider protocol") for tests, demos and
//! chaos runs, and misbehaves on demand as real providers do.
//!
//! - `payments/`: create (201 new, 200 replay, 422 for another body under
//!   a key), look up (by key or by reference), list; the provider's own
//!   state machine (pending, then paid or failed; paid, then maybe
//!   returned; never back); keys forgotten after a window; the faults on
//!   those calls.
//! - `webhooks.rs`: a signed event for every paid, failed or returned payment,
//!   retried with backoff until acknowledged, duplicated, held back or
//!   lost at the set rates.
//! - `faults.rs`: every behaviour, as flags and as `POST /v1/faults`.
//! - `tamper.rs`: the provider's records going wrong on demand (a payment
//!   lost, or changed outside its state machine), for reconciliation.
//!
//! Here: the shared state, the routes, and the control endpoints
//! (`/v1/faults`, `/v1/webhook-endpoint`, `/v1/counters`, `/v1/arrivals`). Randomness comes
//! from `--seed`: a payment's fate and its webhooks' fates are functions of
//! the seed and its key (`chance`); the faults on calls follow one seeded
//! generator in the order calls arrive. It keeps everything in memory.

mod faults;
mod payments;
mod tamper;
mod webhooks;

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use faults::{Faults, DELAY_MS_MAX, RETRY_AFTER_SECS_MAX, WEBHOOK_ATTEMPTS_MAX};
pub use payments::Arrival;
pub use webhooks::WebhookEndpoint;

/// Largest request body the simulator reads.
pub const MAX_SIM_BODY_BYTES: usize = 16 * 1024;

/// How a simulator starts.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Its behaviour.
    pub faults: Faults,
    /// The seed of everything random.
    pub seed: u64,
    /// Where webhooks go; none are sent without one.
    pub webhook: Option<WebhookEndpoint>,
}

/// Counters of what the simulator did.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct SimCounters {
    /// Payments accepted (one per key).
    pub applied: u64,
    /// Repeats answered 200 with the stored payment.
    pub replayed: u64,
    /// New payments answered with an injected 503.
    pub injected_errors: u64,
    /// Payments accepted whose answer was delayed past the caller's timeout.
    pub applied_then_timed_out: u64,
    /// Same key with a different request: answered 422.
    pub conflicts: u64,
    /// Calls answered 429.
    pub rate_limited: u64,
    /// Calls answered with a refusal (a refused key's repeats too).
    pub refused: u64,
    /// Requests that are not valid (no key, a body that does not parse): 400.
    pub bad_requests: u64,
    /// Payments that became paid.
    pub paid: u64,
    /// Payments that became failed.
    pub failed: u64,
    /// Look-ups by idempotency key.
    pub lookups: u64,
    /// Look-ups by reference.
    pub reference_lookups: u64,
    /// Paid payments returned (by their bank, or by hand).
    pub returned: u64,
    /// Idempotency keys forgotten (a create under one is a new payment).
    pub keys_forgotten: u64,
    /// Webhook events made (one per paid, failed or returned payment).
    pub events: u64,
    /// Events not sent because no webhook endpoint was set.
    pub webhooks_unsent: u64,
    /// Events lost on purpose (never sent).
    pub webhooks_lost: u64,
    /// Events sent twice on purpose.
    pub webhooks_duplicated: u64,
    /// Sends held back by a random delay on purpose.
    pub webhooks_reordered: u64,
    /// POSTs to the webhook endpoint.
    pub webhook_attempts: u64,
    /// POSTs answered non-2xx or not answered (each retried).
    pub webhook_failures: u64,
    /// Sends acknowledged with a 2xx (a duplicate counts twice).
    pub webhooks_delivered: u64,
    /// Sends given up after `webhook_attempts_max` tries or when the
    /// endpoint was removed.
    pub webhooks_abandoned: u64,
}

struct Sim {
    seed: u64,
    faults: Faults,
    webhook: Option<WebhookEndpoint>,
    ledger: payments::Ledger,
    counters: SimCounters,
    rng: ChaCha8Rng,
    client: reqwest::Client,
}

type Shared = Arc<Mutex<Sim>>;

fn lock(sim: &Shared) -> std::sync::MutexGuard<'_, Sim> {
    sim.lock().expect("no simulator task panics while holding the lock")
}

/// The simulator's HTTP routes.
pub fn router(options: Options) -> Router {
    let state: Shared = Arc::new(Mutex::new(Sim {
        seed: options.seed,
        faults: options.faults,
        webhook: options.webhook,
        ledger: payments::Ledger::default(),
        counters: SimCounters::default(),
        rng: ChaCha8Rng::seed_from_u64(options.seed),
        // A webhook goes to the endpoint set, never where a redirect points:
        // a signed event re-sent elsewhere, or a 3xx taken for delivered.
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a client without redirects builds"),
    }));
    Router::new()
        .route("/v1/payments", post(payments::create).get(payments::get))
        .route("/v1/payments/{id}", delete(tamper::forget).patch(tamper::alter))
        .route("/v1/payments/{id}/return", post(payments::return_payment))
        .route("/v1/faults", post(set_faults).get(get_faults))
        .route("/v1/webhook-endpoint", post(set_webhook).get(get_webhook))
        .route("/v1/counters", get(counters))
        .route("/v1/arrivals", get(payments::arrivals))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_SIM_BODY_BYTES))
        .with_state(state)
}

/// Serves a simulator with `faults` and `seed` and no webhooks on
/// `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, faults: Faults, seed: u64) -> anyhow::Result<()> {
    serve_with(
        listener,
        Options {
            faults,
            seed,
            webhook: None,
        },
    )
    .await
}

/// Serves a simulator started with `options` on `listener` until the task
/// is dropped.
pub async fn serve_with(listener: tokio::net::TcpListener, options: Options) -> anyhow::Result<()> {
    options.faults.validate().map_err(anyhow::Error::msg)?;
    axum::serve(listener, router(options)).await?;
    Ok(())
}

/// A number in [0, 1) that depends only on the seed, what is rolled for and
/// its subject (a key, a payment and its event): the same on every run and
/// whatever order calls arrive in.
fn chance(seed: u64, what: &str, subject: &str) -> f64 {
    let digest = Sha256::new()
        .chain_update(seed.to_le_bytes())
        .chain_update(what.as_bytes())
        .chain_update([0])
        .chain_update(subject.as_bytes())
        .finalize();
    let bits = u64::from_le_bytes(digest[..8].try_into().expect("a SHA-256 digest has 8 bytes"));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// The simulator's error answer: a status and `{"error": message}`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

async fn set_faults(State(sim): State<Shared>, body: axum::body::Bytes) -> Response {
    let faults: Faults = match serde_json::from_slice(&body) {
        Ok(faults) => faults,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("faults: {e}")),
    };
    if let Err(why) = faults.validate() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, why);
    }
    lock(&sim).faults = faults;
    StatusCode::NO_CONTENT.into_response()
}

async fn get_faults(State(sim): State<Shared>) -> Json<Faults> {
    Json(lock(&sim).faults)
}

/// `{"url", "secret"}` sets where webhooks go and the secret they are
/// signed with (sends already under way use it from their next try);
/// `null` stops sending.
async fn set_webhook(State(sim): State<Shared>, body: axum::body::Bytes) -> Response {
    let endpoint: Option<WebhookEndpoint> = match serde_json::from_slice(&body) {
        Ok(endpoint) => endpoint,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("webhook endpoint: {e}")),
    };
    if let Some(Err(why)) = endpoint.as_ref().map(WebhookEndpoint::validate) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, why);
    }
    lock(&sim).webhook = endpoint;
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Serialize)]
struct WebhookShown {
    url: Option<String>,
}

/// Where webhooks go (the secret is never shown).
async fn get_webhook(State(sim): State<Shared>) -> Json<WebhookShown> {
    Json(WebhookShown {
        url: lock(&sim).webhook.as_ref().map(|w| w.url.clone()),
    })
}

async fn counters(State(sim): State<Shared>) -> Json<SimCounters> {
    let state = lock(&sim);
    Json(SimCounters {
        keys_forgotten: state.ledger.keys_forgotten,
        ..state.counters
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chance_is_a_function_of_seed_what_and_subject() {
        let a = chance(1, "fail", "key-1");
        assert_eq!(a, chance(1, "fail", "key-1"));
        assert_ne!(a, chance(2, "fail", "key-1"));
        assert_ne!(a, chance(1, "refuse", "key-1"));
        assert_ne!(a, chance(1, "fail", "key-2"));
        assert_ne!(chance(1, "ab", "c"), chance(1, "a", "bc"), "the parts are delimited");
        let rolls: Vec<f64> = (0..10_000).map(|i| chance(7, "x", &i.to_string())).collect();
        assert!(rolls.iter().all(|r| (0.0..1.0).contains(r)));
        let below_a_fifth = rolls.iter().filter(|r| **r < 0.2).count();
        assert!(
            (1_800..2_200).contains(&below_a_fifth),
            "{below_a_fifth} of 10000 below 0.2"
        );
    }
}
