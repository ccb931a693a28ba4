//! A worker's own `/metrics` (Prometheus text): the engine's claim and
//! handler latency histograms, this process's counters, and whether its
//! database answers (`settled_database_up`). Served only with
//! `settled worker --metrics-bind ADDR`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use settled_engine::DrainStats;

/// Serves a worker's own metrics (claim and handler latency histograms, its
/// counters, and a probe of `pool`) on `listener` until the task is dropped.
pub(crate) async fn serve(listener: tokio::net::TcpListener, stats: Arc<DrainStats>, pool: sqlx::PgPool) {
    let handle = crate::api::metrics::handle;
    handle();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (stats, pool) = (stats.clone(), pool.clone());
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
                let up = crate::watch::database_up(&pool).await;
                handle().render() + &crate::watch::database_up_text(up)
            }
        }),
    );
    if let Err(err) = axum::serve(listener, app).await {
        tracing::warn!(error = %err, "worker metrics server stopped");
    }
}
