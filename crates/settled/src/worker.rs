//! A worker process's life around the engine: register, serve its own
//! metrics if asked, stop on SIGTERM/SIGINT, then let the settlement job
//! drain one period ([`run_worker`]) or run the scheduling daemon
//! (`run_daemon`). The lifecycle itself (start or join, drain, finish,
//! catch-up, reopen) is the engine's; this module never writes SQL.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use settled_engine::daemon::DaemonConfig;
use settled_engine::{ByMode, Drainer, RetryPolicy};
use settled_engine::{DrainConfig, InTransaction, LeaseConfig, Leased, WorkOutcome, Worker};
use sqlx::PgPool;

use crate::period::Period;
use crate::provider::HttpProvider;
use crate::settlement::{job, SettleRewards, SettleWithProvider};

/// How items are processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Claim, pay (ledger and balances) and mark settled in one transaction.
    Tx,
    /// Claim with a lease, pay through the provider outside any transaction,
    /// then complete with a fenced write.
    Leased,
}

/// The production drainer: settlement's handlers in the chosen mode.
pub(crate) type SettlementDrainer = ByMode<SettleRewards, SettleWithProvider<HttpProvider>>;

/// Builds the production drainer. Leased mode pays through a provider, so it
/// needs one (which keeps keys `key_window`).
pub(crate) fn drainer(
    mode: Mode,
    provider_url: Option<&str>,
    provider_timeout: Duration,
    leases: LeaseConfig,
    key_window: Duration,
) -> anyhow::Result<SettlementDrainer> {
    Ok(match mode {
        Mode::Tx => ByMode::InTransaction(InTransaction(Arc::new(SettleRewards))),
        Mode::Leased => {
            let url = provider_url.context("leased mode pays through a payment provider: give --provider-url")?;
            ByMode::Leased(Leased {
                handler: Arc::new(
                    SettleWithProvider::new(HttpProvider::new(url, provider_timeout)?).with_key_window(key_window),
                ),
                leases,
            })
        }
    })
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
    /// Attempts and backoff.
    pub retry: RetryPolicy,
    /// Where to serve this worker's Prometheus metrics (None: nowhere).
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// How long claim loops ride out the database being away.
    pub max_outage: Duration,
}

impl WorkerOptions {
    fn drain_config(&self) -> DrainConfig {
        DrainConfig {
            chunk: self.chunk,
            concurrency: self.concurrency,
            retry: self.retry,
            max_outage: self.max_outage,
            ..DrainConfig::default()
        }
    }
}

/// How a worker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerOutcome {
    /// There was no run to work on.
    NothingToDo,
    /// It took its turn at a run.
    Worked(WorkOutcome),
}

/// Runs one worker until its period (or the running run, without a period)
/// has no work left, then exits.
pub async fn run_worker<D: Drainer>(pool: &PgPool, opts: &WorkerOptions, drainer: &D) -> anyhow::Result<WorkerOutcome> {
    let (worker, background) = start(pool, opts).await?;
    let outcome = work_once(pool, opts, drainer, &worker).await;
    stop(worker, background).await;
    outcome
}

async fn work_once<D: Drainer>(
    pool: &PgPool,
    opts: &WorkerOptions,
    drainer: &D,
    worker: &Worker,
) -> anyhow::Result<WorkerOutcome> {
    let scope = match opts.period {
        Some(period) => period.to_string(),
        None => match job().running_run(pool).await? {
            Some(run) => run.scope,
            None => return Ok(WorkerOutcome::NothingToDo),
        },
    };
    let outcome = job()
        .work(pool, &scope, drainer, &opts.drain_config(), worker)
        .await
        .with_context(|| format!("settling period {scope}"))?;
    Ok(WorkerOutcome::Worked(outcome))
}

/// Runs the scheduling daemon until SIGTERM/SIGINT (see `settled_engine::daemon`).
pub(crate) async fn run_daemon<D: Drainer>(
    pool: &PgPool,
    opts: &WorkerOptions,
    drainer: &D,
    daemon: &DaemonConfig,
) -> anyhow::Result<()> {
    let (worker, background) = start(pool, opts).await?;
    let result = settled_engine::daemon::run(job(), pool, drainer, &opts.drain_config(), &worker, daemon).await;
    stop(worker, background).await;
    Ok(result?)
}

/// Registers the worker, checks the work table, and starts what runs beside
/// the drain: the signal handler and, if asked, the metrics server.
async fn start(pool: &PgPool, opts: &WorkerOptions) -> anyhow::Result<(Worker, Vec<tokio::task::JoinHandle<()>>)> {
    job().check_work_table(pool).await?;
    let worker = Worker::register(pool, env!("CARGO_PKG_VERSION")).await?;
    let mut background = vec![tokio::spawn(stop_on_signal(worker.stats().clone()))];
    if let Some(addr) = opts.metrics_bind {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics address {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "worker metrics on /metrics");
        background.push(tokio::spawn(crate::worker_metrics::serve(
            listener,
            worker.stats().clone(),
            pool.clone(),
        )));
    }
    Ok((worker, background))
}

async fn stop(worker: Worker, background: Vec<tokio::task::JoinHandle<()>>) {
    for task in &background {
        task.abort();
    }
    worker.deregister().await;
}

/// Returns at the first SIGTERM or SIGINT (never, if they cannot be caught).
pub(crate) async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// SIGTERM or SIGINT: stop claiming; in-flight work finishes (or, in leased
/// mode, is given back after the shutdown grace).
async fn stop_on_signal(stats: Arc<settled_engine::DrainStats>) {
    stop_signal().await;
    tracing::info!("signal received: finishing the work in flight, claiming no more");
    stats.stop.store(true, std::sync::atomic::Ordering::Relaxed);
}
