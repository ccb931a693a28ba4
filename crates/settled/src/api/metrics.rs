//! `GET /metrics` (Prometheus text format) and `GET /readyz`.
//!
//! Worker processes keep their own counters in the engine's worker
//! registry; the API server turns the database's exact state into metrics at scrape time,
//! so every server reports the same numbers and nothing is lost when a
//! process dies. Names follow Prometheus conventions (`_total`, base units).

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use settled_engine::raw::ItemStatus;
use settled_engine::raw::StatusCounts;

use super::dashboard::queries::StoredReport;
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

/// Runs whose stored reports a scrape adds up (one a day: 270 years).
const RUNS_COUNTED: i64 = 100_000;

/// The database's exact state at scrape time.
struct Snapshot {
    items: StatusCounts,
    runs: settled_engine::raw::runs::RunCounts,
    workers: settled_engine::raw::workers::WorkerTotals,
    payouts: i64,
    ledger_entries: i64,
}

async fn snapshot(state: &AppState) -> anyhow::Result<Snapshot> {
    let job = crate::settlement::job();
    let mut conn = state.reads.acquire().await?;
    // Items of periods with a run: a finished run's counts are its stored
    // report (exact, computed once by its finisher), the running run's are
    // counted now. A scrape reads no finished period again, so it costs the
    // same after years of periods (a count over every partition took 2.4 s
    // at ten million). Every settled item has exactly one ledger row
    // (`settled verify` proves it), so the ledger's entries are the settled
    // items.
    let live = match settled_engine::raw::runs::running(&mut conn, job.name()).await? {
        Some(run) => vec![job.queue().count_by_status(&mut conn, &run.scope).await?],
        None => Vec::new(),
    };
    let stored: Vec<_> = settled_engine::raw::runs::list(&mut conn, job.name(), RUNS_COUNTED)
        .await?
        .iter()
        .filter_map(StoredReport::of)
        .map(|r| r.counts)
        .collect();
    let items = StatusCounts {
        counts: ItemStatus::ALL
            .iter()
            .map(|s| (*s, stored.iter().chain(&live).map(|c| c.get(*s)).sum()))
            .collect(),
    };
    let runs = settled_engine::raw::runs::count_by_state(&mut conn, job.name()).await?;
    let workers = settled_engine::raw::workers::totals(&state.reads).await?;
    let payouts: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement.payouts")
        .fetch_one(&mut *conn)
        .await?;
    let ledger_entries = items.get(ItemStatus::Settled);
    Ok(Snapshot {
        items,
        runs,
        workers,
        payouts,
        ledger_entries,
    })
}

/// `GET /metrics`.
pub async fn serve(State(state): State<AppState>) -> Response {
    let s = match snapshot(&state).await {
        Ok(s) => s,
        Err(err) => return Problem::unavailable(err).into_response(),
    };
    for (status, n) in &s.items.counts {
        metrics::gauge!("settled_items", "status" => status.as_str()).set(*n as f64);
    }
    let settled = s.items.get(settled_engine::raw::ItemStatus::Settled);
    metrics::counter!("settled_items_settled_total").absolute(settled as u64);
    metrics::counter!("settled_ledger_entries_total").absolute(s.ledger_entries as u64);
    for (run_state, n) in [
        ("running", s.runs.running),
        ("finished", s.runs.finished),
        ("cancelled", s.runs.cancelled),
    ] {
        metrics::gauge!("settled_runs", "state" => run_state).set(n as f64);
    }
    metrics::counter!("settled_fence_rejections_total").absolute(s.workers.fence_rejections as u64);
    metrics::counter!("settled_lease_rescues_total").absolute(s.workers.leases_rescued as u64);
    metrics::gauge!("settled_workers_alive").set(s.workers.alive as f64);
    metrics::gauge!("settled_worker_heartbeat_age_seconds").set(s.workers.oldest_heartbeat_age_secs);
    metrics::counter!("settled_payouts_total").absolute(s.payouts as u64);
    for (name, pool) in [("main", &state.pool), ("reads", &state.reads)] {
        let idle = pool.num_idle() as f64;
        metrics::gauge!("settled_db_pool_connections", "pool" => name, "state" => "idle").set(idle);
        metrics::gauge!("settled_db_pool_connections", "pool" => name, "state" => "in_use")
            .set(f64::from(pool.size()) - idle);
    }
    let mut response = (StatusCode::OK, handle().render()).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// `GET /readyz`: 200 once the database answers, has every migration this
/// version needs, and takes writes; else 503 saying which (a standby, or
/// `default_transaction_read_only`, answers reads but every payout and hold
/// would fail, so an orchestrator must not route writes to it).
pub async fn ready(State(state): State<AppState>) -> Response {
    let not_ready = |kind: &'static str, detail: String| {
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind, "Not ready", detail).into_response()
    };
    match crate::db::read_only_reason(&state.pool).await {
        Ok(None) => {}
        Ok(Some(reason)) => {
            return not_ready(
                "read-only",
                format!("this server is read-only (a standby?): {reason}; payouts and holds cannot succeed here"),
            )
        }
        Err(err) => return Problem::unavailable(err).into_response(),
    }
    match crate::db::pending_migrations(&state.pool).await {
        Ok(pending) if pending.is_empty() => {
            (StatusCode::OK, axum::Json(serde_json::json!({"status": "ready"}))).into_response()
        }
        Ok(pending) => not_ready("not-migrated", format!("{}; run `settled migrate`", pending.describe())),
        Err(err) => Problem::unavailable(err).into_response(),
    }
}
