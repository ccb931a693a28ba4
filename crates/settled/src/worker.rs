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
    /// Where to serve this worker's Prometheus metrics (None: nowhere).
    pub metrics_bind: Option<std::net::SocketAddr>,
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
    Drained { run_id: i64, settled: u64, finished: bool },
    /// Stopped by a signal before the run drained.
    Stopped { run_id: i64, settled: u64 },
}

/// Settings of `settled worker` without `--period`: a daemon that starts
/// runs when its schedule is due.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// When runs are due; each fire time settles the previous local day.
    pub schedule: settled_engine::Schedule,
    /// How many days back missed runs are created (catch-up).
    pub catch_up_days: u32,
    /// Longest pause between two looks when idle (notifications wake it sooner).
    pub max_poll: Duration,
}

/// A registered worker process: its id, its counters, its heartbeat.
struct Worker {
    pool: PgPool,
    id: Uuid,
    stats: Arc<DrainStats>,
    opts: WorkerOptions,
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl Worker {
    async fn register(pool: &PgPool, opts: &WorkerOptions) -> anyhow::Result<Worker> {
        anyhow::ensure!(opts.work_ms <= MAX_WORK_MS, "--work-ms must be at most {MAX_WORK_MS}");
        let id = workers::register(pool, env!("CARGO_PKG_VERSION")).await?;
        let stats = Arc::new(DrainStats::default());
        let mut background = vec![
            tokio::spawn(heartbeat_loop(pool.clone(), id, stats.clone())),
            tokio::spawn(stop_on_signal(stats.clone())),
        ];
        if let Some(addr) = opts.metrics_bind {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics address {addr}"))?;
            tracing::info!(addr = %listener.local_addr()?, "worker metrics on /metrics");
            background.push(tokio::spawn(crate::api::metrics::serve_worker_metrics(
                listener,
                stats.clone(),
            )));
        }
        Ok(Worker {
            pool: pool.clone(),
            id,
            stats,
            opts: opts.clone(),
            background,
        })
    }

    fn stopping(&self) -> bool {
        self.stats.stop.load(Ordering::Relaxed)
    }

    async fn deregister(self) {
        for task in &self.background {
            task.abort();
        }
        if let Err(err) = workers::stopped(&self.pool, self.id, &self.stats).await {
            tracing::warn!(error = %err, "could not record the worker's stop");
        }
        let s = &self.stats;
        tracing::info!(
            worker = %self.id,
            settled = s.items_settled.load(Ordering::Relaxed),
            failed = s.items_failed.load(Ordering::Relaxed),
            retried = s.items_retried.load(Ordering::Relaxed),
            fence_rejections = s.fence_rejections.load(Ordering::Relaxed),
            leases_rescued = s.leases_rescued.load(Ordering::Relaxed),
            leases_released = s.leases_released.load(Ordering::Relaxed),
            "worker stopped"
        );
    }

    /// Joins (or starts) the run of `period` and drains it.
    async fn settle_period(&self, period: Period) -> anyhow::Result<WorkerOutcome> {
        let pool = &self.pool;
        let joined = settlement::start_or_join_run(pool, period, self.id).await?;
        let run = joined.run;
        if run.state != RunState::Running {
            tracing::info!(run = run.id, %period, state = run.state.as_str(), "run is not running; nothing to do");
            return Ok(WorkerOutcome::RunNotRunning(run.id, run.state));
        }
        tracing::info!(run = run.id, %period, worker = %self.id, starter = joined.started, mode = ?self.opts.mode, "working on run");
        if joined.started {
            // Input loaded moments ago may be unknown to the planner; best effort
            // (a role that does not own the table cannot, and autovacuum will).
            let mut conn = pool.acquire().await?;
            if let Err(err) = queue().refresh_statistics(&mut conn).await {
                tracing::warn!(error = %err, "could not refresh the work table's statistics");
            }
        }
        let settled_before = self.stats.items_settled.load(Ordering::Relaxed);
        self.drain(run.id, period)
            .await
            .with_context(|| format!("settling period {period}"))?;
        let settled = self.stats.items_settled.load(Ordering::Relaxed) - settled_before;
        if self.stopping() {
            tracing::info!(run = run.id, %period, settled, "stopped by signal");
            return Ok(WorkerOutcome::Stopped {
                run_id: run.id,
                settled,
            });
        }
        let finished = finish_if_drained(pool, run.id, period, self.id).await?;
        Ok(WorkerOutcome::Drained {
            run_id: run.id,
            settled,
            finished,
        })
    }

    async fn drain(&self, run_id: i64, period: Period) -> Result<(), settled_engine::EngineError> {
        let opts = &self.opts;
        let cfg = DrainConfig {
            chunk: opts.chunk,
            concurrency: opts.concurrency,
            retry: opts.retry,
            ..DrainConfig::default()
        };
        let scope = period.to_string();
        let work_per_item = Duration::from_millis(opts.work_ms);
        match opts.mode {
            Mode::Tx => {
                let handler = Arc::new(SettleRewards { work_per_item });
                settled_engine::drain_in_transactions(
                    &self.pool,
                    queue(),
                    run_id,
                    &scope,
                    handler,
                    &cfg,
                    self.stats.clone(),
                )
                .await
            }
            Mode::Leased => {
                let provider = opts
                    .provider_url
                    .as_deref()
                    .map(|url| HttpProvider::new(url, opts.provider_timeout))
                    .transpose()
                    .map_err(|e| settled_engine::EngineError::Invariant(format!("provider: {e}")))?;
                let handler = Arc::new(SettleWithProvider {
                    provider,
                    work_per_item,
                });
                settled_engine::drain_leased(
                    &self.pool,
                    queue(),
                    run_id,
                    &scope,
                    self.id,
                    handler,
                    &cfg,
                    opts.leases,
                    self.stats.clone(),
                )
                .await
            }
        }
    }
}

/// Runs one worker until its period (or the running run, without a period)
/// has no work left, then exits.
pub async fn run_worker(pool: &PgPool, opts: &WorkerOptions) -> anyhow::Result<WorkerOutcome> {
    let worker = Worker::register(pool, opts).await?;
    let outcome = match opts.period {
        Some(period) => worker.settle_period(period).await,
        None => {
            let running = {
                let mut conn = pool.acquire().await?;
                runs::running(&mut conn, JOB).await?
            };
            match running {
                Some(run) => match Period::parse(&run.period) {
                    Ok(period) => worker.settle_period(period).await,
                    Err(e) => Err(anyhow::anyhow!(e)),
                },
                None => Ok(WorkerOutcome::NothingToDo),
            }
        }
    };
    worker.deregister().await;
    outcome
}

/// Runs a worker daemon until SIGTERM/SIGINT: at each due time of the
/// schedule it creates the run of the previous local day (or joins the one
/// another server created), creates missed runs of the last
/// `catch_up_days` days oldest first, settles any running run, and sleeps
/// until the next due time, a notification, or the next poll.
pub async fn run_daemon(pool: &PgPool, opts: &WorkerOptions, daemon: &DaemonOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        daemon.catch_up_days <= settled_engine::schedule::MAX_CATCH_UP_DAYS,
        "--catch-up-days must be at most {}",
        settled_engine::schedule::MAX_CATCH_UP_DAYS
    );
    let worker = Worker::register(pool, opts).await?;
    let result = daemon_loop(&worker, daemon).await;
    worker.deregister().await;
    result
}

async fn daemon_loop(worker: &Worker, daemon: &DaemonOptions) -> anyhow::Result<()> {
    let pool = &worker.pool;
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen_all([runs::RUNS_CHANNEL, runs::ITEMS_CHANNEL]).await?;
    tracing::info!(
        worker = %worker.id, schedule = daemon.schedule.expression(), tz = %daemon.schedule.tz(),
        catch_up_days = daemon.catch_up_days, "worker daemon started"
    );
    let mut skipped_once = std::collections::HashSet::new();
    let mut poll = Duration::from_millis(250);
    while !worker.stopping() {
        match settlement::finished_run_with_work(pool).await {
            Ok(Some(period)) => settlement::reopen_runs_with_work(pool, &[period]).await,
            Ok(None) => {}
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "could not look for reopened work"),
        }
        match start_due_runs(worker, daemon, &mut skipped_once).await {
            Ok(()) => {}
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "could not start due runs"),
        }
        let running = {
            let mut conn = pool.acquire().await?;
            runs::running(&mut conn, JOB).await?
        };
        if let Some(run) = running {
            let period = Period::parse(&run.period).map_err(anyhow::Error::msg)?;
            match worker.settle_period(period).await {
                Ok(outcome) => tracing::info!(?outcome, "run settled"),
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "settling failed; retrying");
                    tokio::time::sleep(poll).await;
                }
            }
            poll = Duration::from_millis(250);
            continue;
        }
        // Idle: until the next due time, a notification, or the next poll.
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
        let until_due = daemon
            .schedule
            .next_after(now)
            .and_then(|t| (t - now).to_std().ok())
            .unwrap_or(daemon.max_poll);
        let wait = poll.min(until_due + Duration::from_millis(50));
        tokio::select! {
            notification = listener.recv() => {
                if let Ok(n) = notification {
                    tracing::debug!(channel = n.channel(), payload = n.payload(), "woken by notification");
                }
                poll = Duration::from_millis(250);
            }
            _ = tokio::time::sleep(wait) => {
                poll = (poll * 2).min(daemon.max_poll);
            }
        }
    }
    Ok(())
}

/// Creates the runs the schedule made due in the catch-up window, oldest
/// first. Exactly one worker's insert creates each run; a period whose run
/// exists (in any state) is left alone; an older running run goes first.
async fn start_due_runs(
    worker: &Worker,
    daemon: &DaemonOptions,
    skipped_once: &mut std::collections::HashSet<Period>,
) -> anyhow::Result<()> {
    let pool = &worker.pool;
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let from = now - chrono::Duration::days(i64::from(daemon.catch_up_days.max(1)));
    for (fired_at, local_date) in daemon.schedule.fire_times(from, now) {
        let period = Period::from_date(local_date - chrono::Duration::days(1));
        let mut conn = pool.acquire().await?;
        if runs::find(&mut conn, JOB, &period.to_string()).await?.is_some() {
            continue;
        }
        let (has_policy, items): (bool, i64) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM settlement.settlement_policy WHERE period = $1),
                    (SELECT count(*) FROM (SELECT 1 FROM settlement.token_trade_volume WHERE period = $1 LIMIT 1) x)",
        )
        .bind(period.date())
        .fetch_one(&mut *conn)
        .await?;
        drop(conn);
        if !has_policy || items == 0 {
            if skipped_once.insert(period) {
                tracing::warn!(
                    %period, %fired_at, has_policy, has_items = items > 0,
                    "due, but not started: a run needs a policy and input (it will start once both exist)"
                );
            }
            continue;
        }
        match settlement::start_or_join_run(pool, period, worker.id).await {
            Ok(joined) if joined.started => {
                let late = now - fired_at > chrono::Duration::minutes(1);
                tracing::info!(run = joined.run.id, %period, %fired_at, catch_up = late, "started the run");
            }
            Ok(_) => {}
            Err(err)
                if err
                    .downcast_ref::<settled_engine::EngineError>()
                    .is_some_and(|e| matches!(e, settled_engine::EngineError::OtherRunActive { .. })) =>
            {
                // One running run per job: the rest wait their turn, oldest first.
                break;
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Marks the run finished when no item is left to do; only one worker wins.
///
/// Workers that drain at the same moment queue on the run's row lock, so
/// the final report (exact counts and sums over the period) is computed once,
/// by the one that finishes; the others then find the run finished. The lock
/// blocks instead of skipping: a worker whose last chunk committed while
/// another was checking must still get its own look, or nobody might finish.
pub async fn finish_if_drained(pool: &PgPool, run_id: i64, period: Period, worker: Uuid) -> anyhow::Result<bool> {
    let mut conn = pool.acquire().await?;
    let scope = period.to_string();
    if queue().count_unfinished(&mut conn, &scope).await? > 0 {
        return Ok(false);
    }
    drop(conn);
    // One snapshot for the checks and the report. Its first statement waits
    // for any other finisher; if that one finished the run meanwhile, the lock
    // fails with a serialization error: the run is finished, by someone else.
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await?;
    let locked = sqlx::query_scalar("SELECT state FROM settled_engine.runs WHERE id = $1 FOR NO KEY UPDATE")
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await;
    let state: Option<String> = match locked {
        Ok(state) => state,
        Err(err) if err.as_database_error().and_then(|e| e.code()).as_deref() == Some("40001") => {
            tx.rollback().await?;
            return Ok(false);
        }
        Err(err) => return Err(err.into()),
    };
    if state.as_deref() != Some(RunState::Running.as_str()) || queue().count_unfinished(&mut tx, &scope).await? > 0 {
        tx.rollback().await?;
        return Ok(false);
    }
    let status = crate::status::period_status_in_tx(&mut tx, period).await?;
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
    let finished = runs::finish(&mut tx, run_id, worker, &report).await?;
    tx.commit().await?;
    if finished {
        tracing::info!(run = run_id, %period, report = %report, "run finished");
    }
    Ok(finished)
}

async fn heartbeat_loop(pool: PgPool, worker: Uuid, stats: Arc<DrainStats>) {
    let mut tick = tokio::time::interval(Duration::from_secs(WORKER_HEARTBEAT_SECS));
    let mut beats = 0u64;
    loop {
        tick.tick().await;
        if let Err(err) = workers::heartbeat(&pool, worker, &stats).await {
            tracing::warn!(error = %err, "worker heartbeat failed");
        }
        beats += 1;
        if beats % 12 == 1 {
            match workers::mark_dead_and_prune(&pool).await {
                Ok((0, 0)) => {}
                Ok((dead, pruned)) => {
                    tracing::info!(dead, pruned, "worker registry: marked dead, pruned")
                }
                // A least-privilege worker may not delete: pruning is left to others.
                Err(err) => tracing::debug!(error = %err, "worker registry upkeep failed"),
            }
        }
    }
}

/// SIGTERM or SIGINT: stop claiming; in-flight work finishes (or, in leased
/// mode, is given back after the shutdown grace).
async fn stop_on_signal(stats: Arc<DrainStats>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    tracing::info!("signal received: finishing the work in flight, claiming no more");
    stats.stop.store(true, Ordering::Relaxed);
}
