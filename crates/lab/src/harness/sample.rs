//! The samples and the descriptor written to stdout as JSONL.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Shared, QUEUE_TABLE};

/// Emits the samples every SAMPLE_EVERY_S, the first on a wall-clock boundary.
pub(super) async fn sample(shared: Arc<Shared>) {
    let every = shared.env.sample_every_s;
    // The first sample's rates cover the time since the start.
    let (mut last_enq, mut last_done, mut last_at) = (0u64, 0u64, Instant::now());
    let mut depth_failing = false;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let next = Duration::from_secs((now.as_secs() / every + 1) * every);
    tokio::time::sleep(next.saturating_sub(now)).await;
    let mut tick = tokio::time::interval(Duration::from_secs(every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (enq, done) = (
            shared.enqueued.load(Ordering::Relaxed),
            shared.stats.settled.load(Ordering::Relaxed),
        );
        // The rates' window ends when the counters are read, not after the
        // depth query below (which waits for a pooled connection).
        let read_at = Instant::now();
        let dt = read_at.duration_since(last_at).as_secs_f64().max(1e-3);
        let mut lines = Vec::new();
        let window_s = shared.env.latency_window_ms as f64 / 1000.0;
        if let Some((p50, p95, p99)) = shared.pickup.percentiles() {
            for (metric, value) in [("claim_p50_ms", p50), ("claim_p95_ms", p95), ("claim_p99_ms", p99)] {
                lines.push(metric_line(&shared, metric, value, window_s));
            }
        }
        lines.push(metric_line(
            &shared,
            "enqueue_rate",
            (enq - last_enq) as f64 / dt,
            every as f64,
        ));
        lines.push(metric_line(
            &shared,
            "completion_rate",
            (done - last_done) as f64 / dt,
            every as f64,
        ));
        // One line when reading the depth starts failing, one when it works again.
        match depth(&shared, Duration::from_secs(every) / 2).await {
            Ok(depth) => {
                if std::mem::take(&mut depth_failing) {
                    tracing::info!("reading the queue depth works again");
                }
                lines.push(metric_line(&shared, "queue_depth", depth, 0.0));
            }
            Err(err) if !depth_failing => {
                depth_failing = true;
                tracing::warn!(error = %format!("{err:#}"), "reading the queue depth failed; samples go without it until it works again");
            }
            Err(_) => {}
        }
        for line in &lines {
            emit(line);
        }
        (last_enq, last_done, last_at) = (enq, done, read_at);
    }
}

/// Jobs ready and not yet claimed, read within `within` (an outage never
/// holds a sample up: the depth is left out of it).
async fn depth(shared: &Shared, within: Duration) -> anyhow::Result<f64> {
    let read = async {
        let mut conn = shared.pool.acquire().await?;
        Ok::<_, anyhow::Error>(shared.queue.stats(&mut conn).await?.ready as f64)
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {within:?}"))?
}

pub(super) fn now_iso() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

pub(super) fn metric_line(shared: &Shared, metric: &str, value: f64, window_s: f64) -> serde_json::Value {
    serde_json::json!({
        "t": now_iso(),
        "system": shared.system(),
        "instance_id": shared.env.instance_id,
        "kind": "adapter",
        "subject_kind": "adapter",
        "subject": "",
        "metric": metric,
        "value": value,
        "window_s": window_s,
    })
}

pub(super) fn descriptor(shared: &Shared) -> serde_json::Value {
    let db_name = shared
        .env
        .database_url
        .split('?')
        .next()
        .and_then(|u| u.rsplit('/').next())
        .unwrap_or_default();
    serde_json::json!({
        "kind": "descriptor",
        "system": shared.system(),
        "family": "settled",
        "instance_id": shared.env.instance_id,
        "event_tables": [QUEUE_TABLE],
        "event_indexes": [],
        "extensions": [],
        "version": env!("CARGO_PKG_VERSION"),
        "schema_version": "settled-engine migrations",
        "db_name": db_name,
        "started_at": now_iso(),
    })
}

/// One JSONL record on stdout, flushed at once.
pub(super) fn emit(record: &serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{record}");
    let _ = out.flush();
}
