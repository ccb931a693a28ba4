//! One bench on its fresh database: creators seeded and settled, the fleet
//! started, the three measurements run in turn and gathered in a report.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::PgPool;

use super::fleet::Fleet;
use super::procs::{settled_balances, wait_listening};
use super::runs::{serve_run, throughput_run, wakeup};
use super::stats::{load_average, median, parent_of};
use super::{PayoutBenchOptions, PayoutBenchReport, CREATORS};
use crate::provider_sim::{Faults, Options};
use settled::db::Database;

pub(super) async fn measure(opts: &PayoutBenchOptions, url: &str, scratch: &Path) -> anyhow::Result<PayoutBenchReport> {
    let load_before = load_average();
    let started_at = chrono::Utc::now().to_rfc3339();
    let exe = std::env::current_exe().context("locating the settled binary")?;
    let db = Database::open_url(url, 8, "settled-bench").await?;
    let server_version: String = sqlx::query_scalar("SELECT version()").fetch_one(&db.pool).await?;
    // Enough for every payout of one base unit the bench makes.
    let creators = settled_balances(&db.pool, &exe, url, CREATORS, 1_000_000_000).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider = format!("http://{}", listener.local_addr()?);
    let faults = Faults {
        latency_ms: opts.provider_latency_ms,
        // Payments stay pending: the bench measures delivery, nothing after it.
        settle_delay_ms: 3_600_000,
        ..Faults::default()
    };
    let sim = tokio::spawn(crate::provider_sim::serve_with(
        listener,
        Options {
            faults,
            seed: crate::bench::BENCH_SEED,
            webhook: None,
        },
    ));
    let mut fleet = Fleet {
        exe,
        url: url.to_string(),
        deliverers: Vec::new(),
        servers: Vec::new(),
    };
    for i in 0..opts.deliverers {
        fleet.deliver(opts, &provider, &scratch.join(format!("deliver-{i}.log")))?;
    }
    wait_listening(&db.pool, opts.deliverers).await?;
    let postmaster = postmaster(&db.pool, opts.database_url.is_none()).await;
    let pids: Vec<u32> = fleet.deliverers.iter().filter_map(|c| c.id()).collect();
    let procs = (postmaster, pids.as_slice());
    eprintln!("bench: payouts: a warm-up backlog (not counted)");
    throughput_run(
        &db.pool,
        &provider,
        &creators,
        opts.backlog.min(2_000),
        "warm-up",
        procs,
    )
    .await?;
    let mut throughput = Vec::new();
    for run in 1..=opts.runs {
        let r = throughput_run(
            &db.pool,
            &provider,
            &creators,
            opts.backlog,
            &format!("run{run}"),
            procs,
        )
        .await?;
        eprintln!(
            "bench: payouts: delivery run {run}: {} payouts in {:.2} s, {:.0}/s",
            r.payouts, r.seconds, r.per_sec
        );
        throughput.push(r);
    }
    let first = fleet.serve(&scratch.join("serve-0.log")).await?;
    let wakeup = wakeup(&db.pool, &first, &provider, &creators, opts.latency_samples).await?;
    eprintln!(
        "bench: payouts: wake-up p50 {:.1} ms, p99 {:.1} ms",
        wakeup.p50_ms, wakeup.p99_ms
    );
    let mut bases = vec![first];
    for i in 1..opts.servers {
        bases.push(fleet.serve(&scratch.join(format!("serve-{i}.log"))).await?);
    }
    let mut serve = Vec::new();
    for run in 1..=opts.runs {
        let r = serve_run(&db.pool, &bases, &creators, opts, run).await?;
        eprintln!(
            "bench: payouts: serve run {run}: {:.0} created/s, {:.0} delivered/s",
            r.created_per_sec, r.delivered_per_sec
        );
        serve.push(r);
        drain(&db.pool, 60).await?;
    }
    let deliverer_lines = fleet.stop_deliverers().await;
    sim.abort();
    db.close().await?;
    Ok(PayoutBenchReport {
        started_at,
        server_version,
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        load_before,
        load_after: load_average(),
        options: opts.clone(),
        throughput_median_per_sec: median(throughput.iter().map(|r| r.per_sec).collect()),
        throughput,
        wakeup,
        serve_median_per_sec: median(serve.iter().map(|r| r.created_per_sec).collect()),
        serve,
        deliverer_lines,
    })
}

/// The postmaster's pid, when the bench runs the server on this machine.
async fn postmaster(pool: &PgPool, ours: bool) -> Option<u32> {
    if !ours {
        return None;
    }
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .ok()?;
    parent_of(backend as u32)
}

/// Waits until no payout is queued, for at most `secs` seconds.
pub(super) async fn drain(pool: &PgPool, secs: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement.payouts WHERE status = 'queued'")
            .fetch_one(pool)
            .await?;
        if queued == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{queued} payouts still queued after {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
