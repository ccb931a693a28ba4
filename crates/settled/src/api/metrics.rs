//! `GET /metrics` (Prometheus text format) and `GET /readyz`.
//!
//! Worker processes keep their own counters in the engine's worker
//! registry; the API server turns the database's exact state into metrics at scrape time,
//! so every server reports the same numbers and nothing is lost when a
//! process dies. Names follow Prometheus conventions (`_total`, base units).
//!
//! Continuous queues' gauges (`work_queue_depth`, `work_queue_oldest_ready_seconds`,
//! `work_queue_paused`) are written straight into the scrape's text rather
//! than kept in the recorder, so a queue that leaves the registry, or whose
//! table cannot be read, leaves no stale series behind. So are the payouts'
//! (`settled_payouts{state}`, `settled_payouts_amount{state}`,
//! `settled_payout_oldest_sent_seconds`, `settled_payouts_returned_total`,
//! `settled_provider_keys_awaiting_operator`,
//! the chain rail's `settled_chain_*` ([`crate::chain::metrics`]),
//! ...): amounts are written as the database's exact integers, never
//! through a float. So are the newest finished run's verification and `settled_database_up`
//! ([`crate::watch`]). While the database does not answer, a scrape gets
//! `settled_database_up 0` alone.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use settled_engine::ItemStatus;
use settled_engine::StatusCounts;

use super::dashboard::queries::StoredReport;
use super::{AppState, Problem, ProblemType};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once).
pub(crate) fn handle() -> &'static PrometheusHandle {
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
        // Counters alerts take increase() of exist from the start at 0, so
        // their first event counts as an increase.
        for reason in std::iter::once("missing").chain(crate::provider::signature::SignatureError::KINDS) {
            metrics::counter!("settled_webhook_signature_failures_total", "reason" => reason).absolute(0);
        }
        handle
    })
}

/// Runs whose stored reports a scrape adds up (one a day: 270 years).
const RUNS_COUNTED: i64 = 100_000;

/// The database's exact state at scrape time.
struct Snapshot {
    items: StatusCounts,
    runs: settled_engine::RunCounts,
    workers: settled_engine::raw::workers::WorkerTotals,
    payouts: crate::payouts::overview::Overview,
    ledger_entries: i64,
    queues: Vec<crate::queues::QueueView>,
    due: crate::watch::RunsDue,
    due_secs: f64,
    chain: Vec<crate::chain::metrics::WalletGauges>,
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
    let live = match job.running_run(&mut *conn).await? {
        Some(run) => vec![job.queue().count_by_status(&mut conn, &run.scope).await?],
        None => Vec::new(),
    };
    let all_runs = job.list_runs(&mut *conn, RUNS_COUNTED).await?;
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&mut *conn).await?;
    let due = state.deadlines.runs_due(&all_runs, now);
    let stored: Vec<_> = all_runs.iter().filter_map(StoredReport::of).map(|r| r.counts).collect();
    let items = StatusCounts {
        counts: ItemStatus::ALL
            .iter()
            .map(|s| (*s, stored.iter().chain(&live).map(|c| c.get(*s)).sum()))
            .collect(),
    };
    let runs = job.count_runs(&mut *conn).await?;
    let workers = settled_engine::raw::workers::totals(&state.reads).await?;
    let payouts = crate::payouts::overview::overview(&mut conn).await?;
    let ledger_entries = items.get(ItemStatus::Settled);
    let queues = crate::queues::overview(&mut conn).await?;
    let chain = crate::chain::metrics::gauges(&mut conn).await?;
    Ok(Snapshot {
        chain,
        items,
        runs,
        workers,
        payouts,
        ledger_entries,
        queues,
        due_secs: due.due_secs(now),
        due,
    })
}

/// `GET /metrics`. While the database does not answer, only
/// `settled_database_up 0` (a scrape that fails would hide why).
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = super::openapi::TAG_SERVER,
    summary = "Prometheus metrics (text format), computed from the database's exact state",
    responses((status = 200, description = "metrics", body = String, content_type = "text/plain")))]
pub(crate) async fn serve(State(state): State<AppState>) -> Response {
    if !crate::watch::database_up(&state.reads).await {
        return text_response(crate::watch::database_up_text(false));
    }
    let s = match snapshot(&state).await {
        Ok(s) => s,
        Err(err) => return Problem::unavailable(err).into_response(),
    };
    for (status, n) in &s.items.counts {
        metrics::gauge!("settled_items", "status" => status.as_str()).set(*n as f64);
    }
    let settled = s.items.get(settled_engine::ItemStatus::Settled);
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
    metrics::counter!("settled_payouts_total").absolute(s.payouts.total() as u64);
    for (due_state, n) in [
        ("not_started", s.due.not_started),
        ("running", s.due.running),
        ("cancelled", s.due.cancelled),
    ] {
        metrics::gauge!("settled_runs_due", "state" => due_state).set(n as f64);
    }
    metrics::gauge!("settled_run_due_seconds").set(s.due_secs);
    metrics::gauge!("settled_run_deadline_seconds").set(state.deadlines.deadline.as_secs_f64());
    for (name, pool) in [("main", &state.pool), ("reads", &state.reads)] {
        let idle = pool.num_idle() as f64;
        metrics::gauge!("settled_db_pool_connections", "pool" => name, "state" => "idle").set(idle);
        metrics::gauge!("settled_db_pool_connections", "pool" => name, "state" => "in_use")
            .set(f64::from(pool.size()) - idle);
    }
    let mut text = handle().render();
    text.push_str(&queue_metrics(&s.queues));
    text.push_str(&payout_metrics(&s.payouts));
    text.push_str(&crate::chain::metrics::text(&s.chain));
    text.push_str(&crate::watch::verification_text(&state.verification));
    text.push_str(&crate::watch::database_up_text(true));
    text_response(text)
}

/// A scrape's answer: 200 with Prometheus text.
fn text_response(text: String) -> Response {
    let mut response = (StatusCode::OK, text).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// The continuous queues' gauges in Prometheus text: depth by state and
/// the oldest ready job's age for each queue whose table could be read, and
/// whether each registered queue is paused.
fn queue_metrics(views: &[crate::queues::QueueView]) -> String {
    if views.is_empty() {
        return String::new();
    }
    let mut depth = String::from(
        "# HELP work_queue_depth Jobs of a continuous queue by state, exact at scrape time.\n# TYPE work_queue_depth gauge\n",
    );
    let mut oldest = String::from(
        "# HELP work_queue_oldest_ready_seconds Seconds since the oldest ready job of a continuous queue could run (0 when none).\n# TYPE work_queue_oldest_ready_seconds gauge\n",
    );
    let mut paused = String::from(
        "# HELP work_queue_paused 1 while a continuous queue is paused, else 0.\n# TYPE work_queue_paused gauge\n",
    );
    for view in views {
        let queue = label_value(&view.name);
        paused.push_str(&format!(
            "work_queue_paused{{queue=\"{queue}\"}} {}\n",
            u8::from(view.paused)
        ));
        let Some(s) = &view.stats else { continue };
        for (state, n) in [
            ("ready", s.ready),
            ("scheduled", s.scheduled),
            ("processing", s.processing),
            ("failed", s.failed),
        ] {
            depth.push_str(&format!(
                "work_queue_depth{{queue=\"{queue}\",state=\"{state}\"}} {n}\n"
            ));
        }
        oldest.push_str(&format!(
            "work_queue_oldest_ready_seconds{{queue=\"{queue}\"}} {}\n",
            s.oldest_ready_secs
        ));
    }
    format!("{depth}{oldest}{paused}")
}

/// The payouts' gauges and counters in Prometheus text, from the
/// database's exact state: every state named (0 when empty), amounts as the
/// exact integers of base units (a scraper stores them as float64, exact
/// up to 2^53).
fn payout_metrics(o: &crate::payouts::overview::Overview) -> String {
    let mut count =
        String::from("# HELP settled_payouts Payouts by state, exact at scrape time.\n# TYPE settled_payouts gauge\n");
    let mut amount = String::from(
        "# HELP settled_payouts_amount Base units of the payouts in each state, exact at scrape time.\n# TYPE settled_payouts_amount gauge\n",
    );
    for s in &o.states {
        count.push_str(&format!("settled_payouts{{state=\"{}\"}} {}\n", s.state, s.count));
        amount.push_str(&format!(
            "settled_payouts_amount{{state=\"{}\"}} {}\n",
            s.state, s.amount
        ));
    }
    let oldest_sent = o.state(crate::payouts::PayoutState::Sent).oldest_secs.unwrap_or(0.0);
    format!(
        "{count}{amount}\
# HELP settled_payout_oldest_sent_seconds Seconds the oldest sent payout has waited for the provider's word (0 when none is sent).
# TYPE settled_payout_oldest_sent_seconds gauge
settled_payout_oldest_sent_seconds {oldest_sent:.3}
# HELP settled_payouts_returned_total Base units returned to balances by payouts that ended unpaid (failed, returned after paid, cancelled, expired).
# TYPE settled_payouts_returned_total counter
settled_payouts_returned_total {}
# HELP settled_payouts_returned_count_total Payouts whose funds were returned.
# TYPE settled_payouts_returned_count_total counter
settled_payouts_returned_count_total {}
# HELP settled_payout_conflicts_total Provider word contradicting a final payout state, recorded and not applied.
# TYPE settled_payout_conflicts_total counter
settled_payout_conflicts_total {}
# HELP settled_provider_events_unknown_total Provider events for payouts settled does not know, kept for review.
# TYPE settled_provider_events_unknown_total counter
settled_provider_events_unknown_total {}
# HELP settled_provider_keys_awaiting_operator Provider keys past the key window whose payment the provider could not vouch for: nothing is sent under them until an operator acts.
# TYPE settled_provider_keys_awaiting_operator gauge
settled_provider_keys_awaiting_operator {}
",
        o.returned_amount, o.returned_count, o.conflicts, o.unknown_events, o.keys_awaiting_operator
    )
}

/// A label value escaped as the text format wants (`\\`, `\"`, `\n`).
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A queue's pickup latency (from when a job could run to its claim), as
/// this process measured it in the engine's histogram: known only for a
/// queue whose jobs this process claimed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pickup {
    /// Jobs claimed.
    pub jobs: u64,
    /// Their mean wait, in seconds.
    pub mean_secs: f64,
    /// The histogram bound that 99% of the waits fall within (None: beyond
    /// its largest bound).
    pub p99_within_secs: Option<f64>,
}

/// The pickup latency of `queue`'s jobs claimed by this process, if any.
pub(crate) fn pickup_latency(queue: &str) -> Option<Pickup> {
    pickup_in(&handle().render(), queue)
}

/// [`pickup_latency`] read from a rendered Prometheus text.
fn pickup_in(text: &str, queue: &str) -> Option<Pickup> {
    let wanted = format!("queue=\"{}\"", label_value(queue));
    let (mut buckets, mut sum, mut count) = (Vec::new(), 0.0, 0.0);
    for line in text.lines() {
        let Some((head, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((metric, labels)) = head.split_once('{') else {
            continue;
        };
        let labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
        let (Some(part), true) = (
            metric.strip_prefix(settled_engine::raw::telemetry::PICKUP_LATENCY),
            labels.contains(&wanted.as_str()),
        ) else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        match part {
            "_sum" => sum = value,
            "_count" => count = value,
            "_bucket" => {
                let le = labels.iter().find_map(|l| l.strip_prefix("le=\"")?.strip_suffix('"'));
                if let Some(le) = le.and_then(|le| le.parse::<f64>().ok()) {
                    buckets.push((le, value));
                }
            }
            _ => {}
        }
    }
    if count < 1.0 {
        return None;
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let p99_within_secs = buckets
        .iter()
        .find(|(le, seen)| le.is_finite() && *seen >= 0.99 * count)
        .map(|(le, _)| *le);
    Some(Pickup {
        jobs: count as u64,
        mean_secs: sum / count,
        p99_within_secs,
    })
}

/// `GET /readyz`: 200 once the database answers, has every migration this
/// version needs, and takes writes; else 503 saying which (a standby, or
/// `default_transaction_read_only`, answers reads but every payout and hold
/// would fail, so an orchestrator must not route writes to it).
#[utoipa::path(get, path = "/readyz", operation_id = "ready", tag = super::openapi::TAG_SERVER,
    summary = "Readiness: 200 once the database answers, is migrated, and takes writes",
    responses(
        (status = 200, description = "ready", body = super::Healthy),
        (status = 503, description = "not ready: the database is unreachable, lacks migrations (not-migrated), or takes no writes (read-only: a standby, or default_transaction_read_only)"),
    ))]
pub(crate) async fn ready(State(state): State<AppState>) -> Response {
    let not_ready = |kind: ProblemType, detail: String| {
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind, "Not ready", detail).into_response()
    };
    match crate::db::read_only_reason(&state.pool).await {
        Ok(None) => {}
        Ok(Some(reason)) => {
            return not_ready(
                ProblemType::ReadOnly,
                format!("this server is read-only (a standby?): {reason}; payouts and holds cannot succeed here"),
            )
        }
        Err(err) => return Problem::unavailable(err).into_response(),
    }
    match crate::db::pending_migrations(&state.pool).await {
        Ok(pending) if pending.is_empty() => {
            let ready = super::Healthy {
                status: super::Health::Ready,
            };
            (StatusCode::OK, axum::Json(ready)).into_response()
        }
        Ok(pending) => not_ready(
            ProblemType::NotMigrated,
            format!("{}; run `settled migrate`", pending.describe()),
        ),
        Err(err) => Problem::unavailable(err).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::pickup_in;

    #[test]
    fn a_queues_pickup_latency_is_read_from_the_recorders_own_histogram() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
            .set_buckets(&[0.01, 0.1, 1.0])
            .unwrap()
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mail = metrics::histogram!(settled_engine::raw::telemetry::PICKUP_LATENCY, "queue" => "mail");
            for wait in [0.005, 0.005, 0.05, 0.5] {
                mail.record(wait);
            }
            metrics::histogram!(settled_engine::raw::telemetry::PICKUP_LATENCY, "queue" => "mail2").record(5.0);
        });
        let text = handle.render();
        let mail = pickup_in(&text, "mail").expect("mail's histogram");
        assert_eq!(mail.jobs, 4);
        assert!((mail.mean_secs - 0.14).abs() < 1e-9, "{mail:?}");
        assert_eq!(mail.p99_within_secs, Some(1.0));
        let slow = pickup_in(&text, "mail2").expect("mail2's histogram");
        assert_eq!((slow.jobs, slow.p99_within_secs), (1, None));
        assert_eq!(pickup_in(&text, "other"), None);
    }
}
