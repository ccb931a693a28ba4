//! The three measurements: a backlog's delivery throughput, the wake-up
//! latency of payouts made one at a time on an idle system, and payouts
//! made through `settled serve` with delivery running.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::PgPool;

use super::measure::drain;
use super::procs::next_payout_id;
use super::stats::{cpu_snapshot, percentile, unix_us};
use super::{PayoutBenchOptions, ServeRun, ThroughputRun, Wakeup, API_TOKEN, DRAIN_SECS_PER_THOUSAND, IDLE_PAUSE_MS};
use crate::provider_sim::Arrival;

/// Commits `n` payouts of one base unit in one transaction, then times
/// their delivery.
pub(super) async fn throughput_run(
    pool: &PgPool,
    provider: &str,
    creators: &[String],
    n: u64,
    tag: &str,
    procs: (Option<u32>, &[u32]),
) -> anyhow::Result<ThroughputRun> {
    let mut tx = pool.begin().await?;
    let first = next_payout_id(&mut tx).await?;
    let made: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE d.outcome = 'paid')
         FROM generate_series(1, $1::bigint) AS i
         CROSS JOIN LATERAL settlement.debit_for_payout(
             ($3::text[])[1 + (i % array_length($3::text[], 1))], 1, 'bench-' || $2 || '-' || i, 'bench',
             NULL, NULL, NULL) AS d",
    )
    .bind(n as i64) // $1
    .bind(format!("{tag}-{}", uuid::Uuid::new_v4().simple())) // $2
    .bind(creators) // $3
    .fetch_one(&mut *tx)
    .await?;
    anyhow::ensure!(made == n as i64, "the backlog made {made} of {n} payouts");
    let applied_before = applied(provider).await?;
    let cpu_before = cpu_snapshot(procs.0, procs.1);
    tx.commit().await?;
    let committed: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await?;
    // Watched at the provider, not in the database: a count of queued
    // payouts every few milliseconds read the dead entries of the status
    // index each time, and that cost more than the delivery.
    let deadline = Instant::now() + Duration::from_secs(60 + n * DRAIN_SECS_PER_THOUSAND / 1_000);
    while applied(provider).await? < applied_before + n {
        anyhow::ensure!(Instant::now() < deadline, "the backlog was not delivered in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drain(pool, 60).await?;
    let cpu_after = cpu_snapshot(procs.0, procs.1);
    let last: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(at))::float8 FROM settlement.payout_history
         WHERE payout_id >= $1 AND from_state = 'queued'",
    )
    .bind(first) // $1
    .fetch_one(pool)
    .await?;
    let keys: std::collections::HashSet<String> =
        sqlx::query_scalar("SELECT provider_key FROM settlement.payouts WHERE id >= $1")
            .bind(first) // $1
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let times: Vec<i64> = arrivals(provider)
        .await?
        .into_iter()
        .filter(|a| keys.contains(&a.idempotency_key))
        .map(|a| a.arrived_us)
        .collect();
    let provider_secs = match (times.iter().min(), times.iter().max()) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
        _ => f64::NAN,
    };
    let seconds = (last - committed).max(1e-6);
    Ok(ThroughputRun {
        payouts: n,
        seconds,
        per_sec: n as f64 / seconds,
        provider_per_sec: times.len() as f64 / provider_secs,
        cpu_postgres_secs: cpu_after.postgres - cpu_before.postgres,
        cpu_deliverers_secs: cpu_after.deliverers - cpu_before.deliverers,
        cpu_simulator_secs: cpu_after.simulator - cpu_before.simulator,
    })
}

/// Payments the provider has applied so far.
async fn applied(provider: &str) -> anyhow::Result<u64> {
    let counters: crate::provider_sim::SimCounters = reqwest::get(format!("{provider}/v1/counters"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(counters.applied)
}

async fn arrivals(provider: &str) -> anyhow::Result<Vec<Arrival>> {
    Ok(reqwest::get(format!("{provider}/v1/arrivals"))
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// Payouts one at a time through `base`, the system idle in between; the
/// time from each 201 to its provider call.
pub(super) async fn wakeup(
    pool: &PgPool,
    base: &str,
    provider: &str,
    creators: &[String],
    samples: u32,
) -> anyhow::Result<Wakeup> {
    drain(pool, 60).await?;
    let http = reqwest::Client::new();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut made = Vec::new();
    for i in 0..samples as usize {
        tokio::time::sleep(Duration::from_millis(IDLE_PAUSE_MS)).await;
        let sent_us = unix_us();
        let r = http
            .post(format!("{base}/v1/payouts"))
            .bearer_auth(API_TOKEN)
            .header("Idempotency-Key", format!("wake-{tag}-{i}"))
            .json(&serde_json::json!({ "creator": creators[i % creators.len()], "amount": "1" }))
            .send()
            .await?;
        let answered_us = unix_us();
        anyhow::ensure!(r.status() == 201, "a payout answered {}", r.status());
        let id = r.json::<serde_json::Value>().await?["id"]
            .as_i64()
            .context("a 201 without an id")?;
        made.push((id, sent_us, answered_us));
    }
    drain(pool, 60).await?;
    let ids: Vec<i64> = made.iter().map(|(id, ..)| *id).collect();
    let key_of: std::collections::HashMap<i64, String> =
        sqlx::query_as("SELECT id, provider_key FROM settlement.payouts WHERE id = ANY($1)")
            .bind(&ids) // $1
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let arrived: std::collections::HashMap<String, i64> = arrivals(provider)
        .await?
        .into_iter()
        .map(|a| (a.idempotency_key, a.arrived_us))
        .collect();
    let (mut from_201, mut from_request, mut before) = (Vec::new(), Vec::new(), 0);
    for (id, sent, answered) in &made {
        let key = key_of
            .get(id)
            .with_context(|| format!("payout {id} is not in the database"))?;
        let at = *arrived
            .get(key)
            .with_context(|| format!("the provider never got payout {id}"))?;
        before += usize::from(at < *answered);
        from_201.push(((at - answered) as f64 / 1e3).max(0.0));
        from_request.push((at - sent) as f64 / 1e3);
    }
    from_201.sort_by(f64::total_cmp);
    from_request.sort_by(f64::total_cmp);
    Ok(Wakeup {
        samples: made.len(),
        p50_ms: percentile(&from_201, 50.0),
        p99_ms: percentile(&from_201, 99.0),
        max_ms: from_201.last().copied().unwrap_or(0.0),
        before_the_201: before,
        from_request_p50_ms: percentile(&from_request, 50.0),
        from_request_p99_ms: percentile(&from_request, 99.0),
    })
}

/// `opts.clients` clients making payouts through `bases` for
/// `opts.serve_seconds`, delivery running.
pub(super) async fn serve_run(
    pool: &PgPool,
    bases: &[String],
    creators: &[String],
    opts: &PayoutBenchOptions,
    run: u32,
) -> anyhow::Result<ServeRun> {
    let stop = Arc::new(AtomicBool::new(false));
    let (created, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let http = reqwest::Client::builder().pool_max_idle_per_host(1024).build()?;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let window_start: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..opts.clients as usize {
        let (stop, created, errors, http) = (stop.clone(), created.clone(), errors.clone(), http.clone());
        let base = bases[c % bases.len()].clone();
        let creators = creators.to_vec();
        let tag = format!("{tag}-{run}-{c}");
        clients.spawn(async move {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let r = http
                    .post(format!("{base}/v1/payouts"))
                    .bearer_auth(API_TOKEN)
                    .header("Idempotency-Key", format!("serve-{tag}-{i}"))
                    .json(&serde_json::json!({ "creator": creators[(c * 7919 + i) % creators.len()], "amount": "1" }))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 201 => created.fetch_add(1, Ordering::Relaxed),
                    _ => errors.fetch_add(1, Ordering::Relaxed),
                };
                i += 1;
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(opts.serve_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    while clients.join_next().await.is_some() {}
    let window_end = window_start + seconds;
    let (delivered, queued): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM settlement.payout_history
                 WHERE from_state = 'queued' AND at >= to_timestamp($1) AND at < to_timestamp($2)),
                (SELECT count(*) FROM settlement.payouts WHERE status = 'queued')",
    )
    .bind(window_start) // $1
    .bind(window_end) // $2
    .fetch_one(pool)
    .await?;
    Ok(ServeRun {
        seconds,
        created_per_sec: created.load(Ordering::Relaxed) as f64 / seconds,
        delivered_per_sec: delivered as f64 / seconds,
        queued_at_end: queued,
        errors: errors.load(Ordering::Relaxed),
    })
}
