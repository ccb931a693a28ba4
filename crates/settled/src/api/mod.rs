//! `settled serve`: the HTTP API (payouts, holds, creators, health, OpenAPI).
//!
//! Owns parsing requests at the edge (addresses, amounts, keys) and mapping
//! outcomes to HTTP. Every once-only rule is kept by the database: the
//! conditional debit, the idempotency key's primary key, the partial unique
//! index on active holds. Never: a check in memory, or check-then-write.

pub mod auth;
pub mod creators;
pub mod dashboard;
pub mod holds;
pub mod metrics;
pub mod openapi;
pub mod payouts;
pub mod problem;

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use settled_engine::once::idempotency::IdempotencyConfig;
use sqlx::PgPool;

pub use auth::Authorized;
pub use problem::Problem;

/// Largest request body read, in bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// How often expired idempotency keys are pruned.
pub const PRUNE_INTERVAL_SECS: u64 = 60;

/// Shared state of the server.
#[derive(Clone)]
pub struct AppState {
    /// The database.
    pub pool: PgPool,
    /// Bearer token required by mutating endpoints (None: they are refused).
    pub api_token: Option<Arc<str>>,
    /// Idempotency key retention and locking.
    pub idempotency: IdempotencyConfig,
}

/// The API's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(dashboard::runs))
        .route("/runs/{id}", get(dashboard::run_report))
        .route("/workers", get(dashboard::workers))
        .route("/items", get(dashboard::items))
        .route("/locks", get(dashboard::locks))
        .route("/dashboard/retry", post(dashboard::retry))
        .route("/healthz", get(healthz))
        .route("/readyz", get(metrics::ready))
        .route("/metrics", get(metrics::serve))
        .route("/openapi.json", get(openapi::serve))
        .route("/v1/payouts", post(payouts::create))
        .route("/v1/payouts/{id}", get(payouts::show))
        .route("/v1/creators/{address}", get(creators::show))
        .route("/v1/holds", post(holds::create))
        .route("/v1/holds/{id}/release", post(holds::release))
        .fallback(|| async { Problem::not_found("no-such-route", "no such endpoint; see /openapi.json") })
        .with_state(state)
}

/// Serves the API on `listener` until the task is dropped; prunes expired
/// idempotency keys in the background.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> anyhow::Result<()> {
    metrics::handle();
    let pool = state.pool.clone();
    let pruner = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(PRUNE_INTERVAL_SECS));
        loop {
            tick.tick().await;
            match settled_engine::once::idempotency::prune(&pool).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(pruned = n, "expired idempotency keys pruned"),
                Err(err) => tracing::warn!(error = %err, "pruning idempotency keys failed"),
            }
        }
    });
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await;
    pruner.abort();
    Ok(served?)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    if let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    }
}

async fn healthz(State(state): State<AppState>) -> Response {
    match sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&state.pool).await {
        Ok(_) => (StatusCode::OK, axum::Json(serde_json::json!({"status": "ok"}))).into_response(),
        Err(err) => Problem::unavailable(err).into_response(),
    }
}

/// Reads the body (at most [`MAX_BODY_BYTES`]) of a request whose
/// Content-Type is `application/json` (415 otherwise) and parses it as a
/// JSON object of `T` (an array or a scalar is refused), naming the field at
/// fault.
pub async fn read_json<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> Result<(T, Bytes), Problem> {
    if !is_json(headers) {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "the body must be JSON, sent with `Content-Type: application/json`",
        )
        .field("Content-Type"));
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|_| {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the body must be at most {MAX_BODY_BYTES} bytes"),
        )
    })?;
    let malformed =
        |message: String| Problem::bad_request("malformed-json", format!("the body is not a valid request: {message}"));
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| malformed(e.to_string()))?;
    if !value.is_object() {
        return Err(Problem::bad_request("malformed-json", "the body must be a JSON object"));
    }
    let value = serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let message = e.inner().to_string();
        // The field at fault: the path to a value of the wrong type, or the
        // one serde names for an unknown or missing field ("unknown field `x`").
        let path = e.path().to_string();
        let field = if path != "." {
            Some(path)
        } else {
            message.split('`').nth(1).map(str::to_string)
        };
        let problem = malformed(message);
        match field {
            Some(field) => problem.field(field),
            None => problem,
        }
    })?;
    Ok((value, bytes))
}

/// True for `application/json`, with or without parameters.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}
