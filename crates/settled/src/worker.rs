//! `settled worker`: one worker process. It registers itself, joins (or
//! starts) the period's run, drains it with `--concurrency` claim loops in
//! in-transaction or leased mode, finishes the run when nothing is left, and
//! exits. SIGTERM/SIGINT: stop claiming, finish or give back what it holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use settled_engine::{runs, workers, DrainConfig, DrainStats, LeaseConfig, RetryPolicy, RunState};
use sqlx::PgPool;
use uuid::Uuid;

use crate::period::Period;
use crate::provider::HttpProvider;
use crate::settlement::{self, queue, SettleRewards, SettleWithProvider, JOB};

/// Seconds between a worker's heartbeats in `settled_engine.workers`.
pub const WORKER_HEARTBEAT_SECS: u64 = 5;
/// Largest simulated per-item work, in milliseconds.
pub const MAX_WORK_MS: u64 = 60_000;

/// How items are processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Claim, pay (ledger and balances) and mark settled in one transaction.
    Tx,
    /// Claim with a lease, pay through the provider outside any transaction,
    /// then complete with a fenced write.
    Leased,
}

/// What a worker does.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The period to settle; None joins the job's running run, if any.
    pub period: Option<Period>,
    /// Claim loops in this process.
    pub concurrency: u32,
    /// Items per claim.
    pub chunk: u32,
    /// Simulated work per item.
    pub work_ms: u64,
    /// Execution mode.
    pub mode: Mode,
    /// The payment provider (leased mode).
    pub provider_url: Option<String>,
    /// Provider call timeout.
    pub provider_timeout: Duration,
    /// Lease timings (leased mode).
    pub leases: LeaseConfig,
    /// Attempts and backoff.
    pub retry: RetryPolicy,
}

/// How a worker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerOutcome {
    /// There was no run to work on.
    NothingToDo,
    /// The run was already finished or cancelled.
    RunNotRunning(i64, RunState),
    /// This worker drained the run (and `finished` says whether it was the
    /// one that marked it finished).
    Drained {
        run_id: i64,
        settled: u64,
        finished: bool,
    },
    /// Stopped by a signal before the run drained.
    Stopped { run_id: i64, settled: u64 },
}

/// Runs one worker until its period has no work left.
pub async fn run_worker(pool: &PgPool, opts: &WorkerOptions) -> anyhow::Result<WorkerOutcome> {
    anyhow::ensure!(
        opts.work_ms <= MAX_WORK_MS,
        "--work-ms must be at most {MAX_WORK_MS}"
    );
    let worker = workers::register(pool, env!("CARGO_PKG_VERSION")).await?;
    let stats = Arc::new(DrainStats::default());
    let heartbeat = tokio::spawn(heartbeat_loop(pool.clone(), worker, stats.clone()));
    let outcome = work(pool, opts, worker, stats.clone()).await;
    heartbeat.abort();
    if let Err(err) = workers::stopped(pool, worker, &stats).await {
        tracing::warn!(error = %err, "could not record the worker's stop");
    }
    tracing::info!(
        %worker,
        settled = stats.items_settled.load(Ordering::Relaxed),
        failed = stats.items_failed.load(Ordering::Relaxed),
        retried = stats.items_retried.load(Ordering::Relaxed),
        fence_rejections = stats.fence_rejections.load(Ordering::Relaxed),
        leases_rescued = stats.leases_rescued.load(Ordering::Relaxed),
        leases_released = stats.leases_released.load(Ordering::Relaxed),
        "worker stopped"
    );
    outcome
}

async fn work(
    pool: &PgPool,
    opts: &WorkerOptions,
    worker: Uuid,
    stats: Arc<DrainStats>,
) -> anyhow::Result<WorkerOutcome> {
    let period = match opts.period {
        Some(p) => p,
        None => {
            let mut conn = pool.acquire().await?;
            match runs::running(&mut conn, JOB).await? {
                Some(run) => Period::parse(&run.period).map_err(anyhow::Error::msg)?,
                None => return Ok(WorkerOutcome::NothingToDo),
            }
        }
    };
    let joined = settlement::start_or_join_run(pool, period, worker).await?;
    let run = joined.run;
    if run.state != RunState::Running {
        tracing::info!(run = run.id, %period, state = run.state.as_str(), "run is not running; nothing to do");
        return Ok(WorkerOutcome::RunNotRunning(run.id, run.state));
    }
    tracing::info!(run = run.id, %period, %worker, starter = joined.started, mode = ?opts.mode, "working on run");
    if joined.started {
        // Input loaded moments ago may be unknown to the planner; best effort
        // (a role that does not own the table cannot, and autovacuum will).
        let mut conn = pool.acquire().await?;
        if let Err(err) = queue().refresh_statistics(&mut conn).await {
            tracing::warn!(error = %err, "could not refresh the work table's statistics");
        }
    }

    let stop_on_signal = tokio::spawn(stop_on_signal(stats.clone()));
    let cfg = DrainConfig {
        chunk: opts.chunk,
        concurrency: opts.concurrency,
        retry: opts.retry,
        ..DrainConfig::default()
    };
    let scope = period.to_string();
    let work_per_item = Duration::from_millis(opts.work_ms);
    let drained = match opts.mode {
        Mode::Tx => {
            let handler = Arc::new(SettleRewards { work_per_item });
            settled_engine::drain_in_transactions(
                pool,
                queue(),
                run.id,
                &scope,
                handler,
                &cfg,
                stats.clone(),
            )
            .await
        }
        Mode::Leased => {
            let provider = opts
                .provider_url
                .as_deref()
                .map(|url| HttpProvider::new(url, opts.provider_timeout))
                .transpose()?;
            let handler = Arc::new(SettleWithProvider {
                provider,
                work_per_item,
            });
            settled_engine::drain_leased(
                pool,
                queue(),
                run.id,
                &scope,
                worker,
                handler,
                &cfg,
                opts.leases,
                stats.clone(),
            )
            .await
        }
    };
    stop_on_signal.abort();
    drained.with_context(|| format!("settling period {period}"))?;
    let settled = stats.items_settled.load(Ordering::Relaxed);
    if stats.stop.load(Ordering::Relaxed) {
        tracing::info!(run = run.id, %period, settled, "stopped by signal");
        return Ok(WorkerOutcome::Stopped {
            run_id: run.id,
            settled,
        });
    }
    let finished = finish_if_drained(pool, run.id, period, worker).await?;
    Ok(WorkerOutcome::Drained {
        run_id: run.id,
        settled,
        finished,
    })
}

/// Marks the run finished when no item is left to do; only one worker wins.
pub async fn finish_if_drained(
    pool: &PgPool,
    run_id: i64,
    period: Period,
    worker: Uuid,
) -> anyhow::Result<bool> {
    let mut conn = pool.acquire().await?;
    if queue()
        .count_unfinished(&mut conn, &period.to_string())
        .await?
        > 0
    {
        return Ok(false);
    }
    let status = crate::status::period_status(&mut conn, period).await?;
    let counts: serde_json::Map<String, serde_json::Value> = status
        .counts
        .iter()
        .map(|(s, n)| (s.as_str().to_string(), serde_json::Value::from(*n)))
        .collect();
    let report = serde_json::json!({
        "items": status.total,
        "counts": counts,
        "paid": status.settled_amount,
        "expected": status.expected_amount,
    });
    let finished = runs::finish(&mut conn, run_id, worker, &report).await?;
    if finished {
        tracing::info!(run = run_id, %period, report = %report, "run finished");
    }
    Ok(finished)
}

async fn heartbeat_loop(pool: PgPool, worker: Uuid, stats: Arc<DrainStats>) {
    let mut tick = tokio::time::interval(Duration::from_secs(WORKER_HEARTBEAT_SECS));
    loop {
        tick.tick().await;
        if let Err(err) = workers::heartbeat(&pool, worker, &stats).await {
            tracing::warn!(error = %err, "worker heartbeat failed");
        }
    }
}

/// SIGTERM or SIGINT: stop claiming; in-flight work finishes (or, in leased
/// mode, is given back after the shutdown grace).
async fn stop_on_signal(stats: Arc<DrainStats>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    tracing::info!("signal received: finishing the work in flight, claiming no more");
    stats.stop.store(true, Ordering::Relaxed);
}
