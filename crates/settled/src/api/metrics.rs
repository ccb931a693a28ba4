//! `GET /metrics` (Prometheus text format) and `GET /readyz`.
//!
//! Worker processes keep their own counters in `settled_engine.workers`; the
//! API server turns the database's exact state into metrics at scrape time,
//! so every server reports the same numbers and nothing is lost when a
//! process dies. Names follow Prometheus conventions (`_total`, base units).

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::{AppState, Problem};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once).
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let buckets = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        let builder = PrometheusBuilder::new();
        let recorder = builder
            .set_buckets(&buckets)
            .unwrap_or_else(|_| PrometheusBuilder::new())
            .build_recorder();
        let handle = recorder.handle();
        // Only fails if another recorder was installed first; then we render an empty set.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

type Snapshot = (i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, f64);

/// `GET /metrics`.
pub async fn serve(State(state): State<AppState>) -> Response {
    let snapshot: Result<Snapshot, sqlx::Error> = sqlx::query_as(
        "SELECT
            (SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'eligible'),
            (SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'processing'),
            (SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'settled'),
            (SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'failed'),
            (SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'held'),
            (SELECT count(*) FROM settled_engine.runs WHERE state = 'running'),
            (SELECT count(*) FROM settled_engine.runs WHERE state = 'finished'),
            (SELECT count(*) FROM settled_engine.runs WHERE state = 'cancelled'),
            (SELECT coalesce(sum(fence_rejections), 0)::bigint FROM settled_engine.workers),
            (SELECT coalesce(sum(leases_rescued), 0)::bigint FROM settled_engine.workers),
            (SELECT count(*) FROM settled_engine.workers
              WHERE stopped_at IS NULL AND heartbeat_at > now() - interval '60 seconds'),
            (SELECT count(*) FROM settlement.payouts),
            (SELECT count(*) FROM settlement.reward_ledger),
            (SELECT coalesce(extract(epoch FROM now() - max(heartbeat_at)), 0)::float8 FROM settled_engine.workers
              WHERE stopped_at IS NULL)",
    )
    .fetch_one(&state.pool)
    .await;
    let s = match snapshot {
        Ok(s) => s,
        Err(err) => return Problem::unavailable(err).into_response(),
    };
    for (status, n) in [
        ("eligible", s.0),
        ("processing", s.1),
        ("settled", s.2),
        ("failed", s.3),
        ("held", s.4),
    ] {
        metrics::gauge!("settled_items", "status" => status).set(n as f64);
    }
    metrics::counter!("settled_items_settled_total").absolute(s.2 as u64);
    metrics::counter!("settled_ledger_entries_total").absolute(s.12 as u64);
    for (run_state, n) in [("running", s.5), ("finished", s.6), ("cancelled", s.7)] {
        metrics::gauge!("settled_runs", "state" => run_state).set(n as f64);
    }
    metrics::counter!("settled_fence_rejections_total").absolute(s.8 as u64);
    metrics::counter!("settled_lease_rescues_total").absolute(s.9 as u64);
    metrics::gauge!("settled_workers_alive").set(s.10 as f64);
    metrics::gauge!("settled_worker_heartbeat_age_seconds").set(s.13);
    metrics::counter!("settled_payouts_total").absolute(s.11 as u64);
    let idle = state.pool.num_idle() as f64;
    metrics::gauge!("settled_db_pool_connections", "state" => "idle").set(idle);
    metrics::gauge!("settled_db_pool_connections", "state" => "in_use").set(f64::from(state.pool.size()) - idle);
    let mut response = (StatusCode::OK, handle().render()).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// `GET /readyz`: 200 once the database answers and its migrations are
/// applied (so the server can serve every endpoint), else 503.
pub async fn ready(State(state): State<AppState>) -> Response {
    let latest = sqlx::migrate!("./migrations")
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    let applied: Result<Option<i64>, sqlx::Error> =
        sqlx::query_scalar("SELECT max(version) FROM public._sqlx_migrations WHERE success")
            .fetch_one(&state.pool)
            .await;
    match applied {
        Ok(Some(v)) if v >= latest => {
            (StatusCode::OK, axum::Json(serde_json::json!({"status": "ready"}))).into_response()
        }
        Ok(_) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-migrated",
            "Not ready",
            "the database lacks migrations; run `settled migrate`",
        )
        .into_response(),
        Err(err) => Problem::unavailable(err).into_response(),
    }
}

/// Serves a worker's own metrics (claim and handler latency histograms, and
/// its counters) on `listener` until the task is dropped.
pub async fn serve_worker_metrics(
    listener: tokio::net::TcpListener,
    stats: std::sync::Arc<settled_engine::DrainStats>,
) {
    use std::sync::atomic::Ordering;
    handle();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let stats = stats.clone();
            async move {
                let counters = [
                    ("settled_worker_claims_total", &stats.claims),
                    ("settled_worker_items_claimed_total", &stats.items_claimed),
                    ("settled_worker_chunks_total", &stats.chunks_committed),
                    ("settled_worker_chunks_rolled_back_total", &stats.chunks_rolled_back),
                    ("settled_worker_items_settled_total", &stats.items_settled),
                    ("settled_worker_items_failed_total", &stats.items_failed),
                    ("settled_worker_items_held_total", &stats.items_held),
                    ("settled_worker_retries_total", &stats.items_retried),
                    ("settled_worker_fence_rejections_total", &stats.fence_rejections),
                    ("settled_worker_lease_rescues_total", &stats.leases_rescued),
                ];
                for (name, value) in counters {
                    metrics::counter!(name).absolute(value.load(Ordering::Relaxed));
                }
                handle().render()
            }
        }),
    );
    if let Err(err) = axum::serve(listener, app).await {
        tracing::warn!(error = %err, "worker metrics server stopped");
    }
}
