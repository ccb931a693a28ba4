//! `settled bench --continuous`: job queues on their own workload, side by
//! side in one run. Settled (in-transaction and leased) and the peers
//! under `bench/peers`, each through its own per-job API, with 1 ms of
//! work and one effect row per job; a producer at a fixed offered rate and
//! one at saturation; W jobs in flight.
//!
//! Every case gets a fresh database on the bench's server: the bench's
//! tables (`workload.rs`), the system's own install, its workers started
//! and ready before the clock. The producer then runs for the case's
//! seconds while a sampler reads the system's tables from
//! `pg_stat_user_tables`; the workers stop, and the effects give the
//! completed jobs/s, the pickup latency and the duplicates of the window
//! (the first seconds, a warm-up, are not counted). Then the database is
//! dropped. `--runs N` repeats the whole matrix, interleaved, and the
//! report quotes each figure's median.

mod pacer;
mod report;
mod systems;
pub mod worker;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;

pub use pacer::{parse_token, token_line, Pacer, TOKEN_JOBS_MAX};
pub use report::{markdown, ContinuousCase, ContinuousReport};
pub use worker::{run_queue_worker, QueueWorkerArgs, ServeMode};

use super::casedb::{create_database_at, drop_database_at};
use workload::{now_us, TableSample};

/// Largest W of one case.
pub const MAX_WORKERS: u32 = 256;
/// Most settled worker processes one case starts (W is split over them).
pub const MAX_WORKER_PROCESSES: u32 = 4;
/// How often the sampler reads the system's tables.
pub const SAMPLE_EVERY_MS: u64 = 500;
/// Longest a system may take to install its schema and say `ready`.
pub const READY_TIMEOUT_SECS: u64 = 300;
/// Longest a system may take to stop after the producer stopped.
pub const STOP_TIMEOUT_SECS: u64 = 60;
/// Longest warm-up at the start of a case, not counted.
pub const WARMUP_SECS_MAX: f64 = 2.0;

/// What the producer does.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Producer {
    /// `--rate` jobs/s, one job per enqueue call.
    Fixed,
    /// As fast as the workers take them: the queue is kept `--depth` deep
    /// with the system's bulk enqueue.
    Saturation,
}

impl Producer {
    /// Its name in reports and in `BENCH_PRODUCER`.
    pub fn name(self) -> &'static str {
        match self {
            Producer::Fixed => "fixed",
            Producer::Saturation => "saturation",
        }
    }
}

/// One system under test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum System {
    /// Settled's engine in one mode.
    Settled(ServeMode),
    /// A peer's `continuous` script under `bench/peers/<name>`.
    Peer(String),
}

impl System {
    /// Its name in reports.
    pub fn name(&self) -> String {
        match self {
            System::Settled(mode) => mode.system().to_string(),
            System::Peer(name) => name.clone(),
        }
    }
}

/// What `settled bench --continuous` measures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ContinuousOptions {
    /// Settled's modes to measure.
    pub settled_modes: Vec<ServeMode>,
    /// Peers to measure (directories of `peers_dir`).
    pub peers: Vec<String>,
    /// Where the peer scripts live.
    pub peers_dir: PathBuf,
    /// W values: jobs in flight at once.
    pub workers: Vec<u32>,
    /// The producers.
    pub producers: Vec<Producer>,
    /// The fixed producer's offered rate, jobs/s.
    pub rate: u64,
    /// Seconds each case's producer runs.
    pub seconds: u64,
    /// Repeats of the whole matrix.
    pub runs: u32,
    /// Settled's jobs per claim.
    pub batch: u32,
    /// The saturation producer keeps this many jobs waiting.
    pub depth: u64,
    /// Settled's retention of finished jobs, seconds.
    pub retention_secs: u64,
    /// Each job's work, ms.
    pub work_ms: u64,
    /// The server (None: a private one started for the run).
    #[serde(skip)]
    pub database_url: Option<String>,
    /// The command line.
    pub command: String,
}

/// One case of the matrix.
#[derive(Debug, Clone)]
pub struct CaseSpec {
    /// The system measured.
    pub system: System,
    /// How jobs are offered.
    pub producer: Producer,
    /// Worker processes (or the system's workers).
    pub workers: u32,
    /// Which repetition of the case (1-based).
    pub run: u32,
}

/// What every case needs.
pub(crate) struct Ctx {
    admin_url: String,
    exe: PathBuf,
    scratch: PathBuf,
    opts: ContinuousOptions,
}

fn check(opts: &ContinuousOptions) -> anyhow::Result<()> {
    anyhow::ensure!(!opts.workers.is_empty(), "--workers: give at least one count");
    anyhow::ensure!(
        opts.workers.iter().all(|w| (1..=MAX_WORKERS).contains(w)),
        "--workers: each count must be 1..={MAX_WORKERS}"
    );
    anyhow::ensure!(!opts.producers.is_empty(), "--producers: give at least one");
    anyhow::ensure!(opts.rate >= 1, "--rate must be at least 1 job/s");
    anyhow::ensure!(opts.seconds >= 1, "--seconds must be at least 1");
    anyhow::ensure!(opts.runs >= 1, "--runs must be at least 1");
    Ok(())
}

/// Runs the matrix and returns its report.
pub async fn continuous(opts: &ContinuousOptions) -> anyhow::Result<ContinuousReport> {
    check(opts)?;
    let scratch = tempfile::Builder::new().prefix("settled-bench-").tempdir()?;
    let (server, admin_url) = super::start_server_at(&opts.database_url, scratch.path(), Vec::new()).await?;
    let ctx = Ctx {
        admin_url,
        exe: std::env::current_exe().context("locating the settled binary")?,
        scratch: scratch.path().to_path_buf(),
        opts: opts.clone(),
    };
    let result = run_matrix(&ctx).await;
    if let Some(server) = server {
        tokio::task::spawn_blocking(move || server.stop()).await??;
    }
    result
}

async fn run_matrix(ctx: &Ctx) -> anyhow::Result<ContinuousReport> {
    let opts = &ctx.opts;
    let mut report = ContinuousReport::start(opts, &ctx.admin_url).await?;
    let mut systems: Vec<System> = opts.settled_modes.iter().map(|m| System::Settled(*m)).collect();
    for peer in &opts.peers {
        match super::peers::install_in(&opts.peers_dir, peer).await {
            Ok(()) => systems.push(System::Peer(peer.clone())),
            Err(err) => report.skipped.push(format!("peer {peer} skipped: {err:#}")),
        }
    }
    for run in 1..=opts.runs {
        for &producer in &opts.producers {
            for &workers in &opts.workers {
                for system in &systems {
                    let spec = CaseSpec {
                        system: system.clone(),
                        producer,
                        workers,
                        run,
                    };
                    let case = run_case(ctx, &spec).await;
                    eprintln!("bench: {}", case.summary());
                    report.cases.push(case);
                }
            }
        }
    }
    report.finish();
    Ok(report)
}

/// One case, on a database of its own; a failure is the case's result.
async fn run_case(ctx: &Ctx, spec: &CaseSpec) -> ContinuousCase {
    let mut case = ContinuousCase::new(spec, &ctx.opts);
    let outcome = async {
        let (name, url) = create_database_at(&ctx.admin_url).await?;
        let measured = measure_case(ctx, spec, &url, &mut case).await;
        drop_database_at(&ctx.admin_url, &name).await?;
        measured
    }
    .await;
    if let Err(err) = outcome {
        case.error = Some(format!("{err:#}"));
    }
    case
}

async fn measure_case(ctx: &Ctx, spec: &CaseSpec, url: &str, case: &mut ContinuousCase) -> anyhow::Result<()> {
    // A producer behind its rate waits for a connection rather than fail
    // the case: its lag shows as jobs/s below the offered rate.
    let pool = PgPoolOptions::new()
        .max_connections(systems::PRODUCER_CONNECTIONS + 1)
        .acquire_timeout(Duration::from_secs(ctx.opts.seconds + STOP_TIMEOUT_SECS))
        .connect(url)
        .await?;
    sqlx::raw_sql(workload::BENCH_TABLES_SQL).execute(&pool).await?;
    let mut running = systems::start(ctx, spec, url, &pool).await?;
    let before = workload::db_work(&pool).await?;
    let sampler = Sampler::start(PgPoolOptions::new().max_connections(1).connect(url).await?);
    let t0 = now_us();
    let produced = running.produce(ctx, spec, &pool).await;
    let t1 = now_us();
    let stopped = running.stop().await;
    case.series = sampler.stop().await;
    let (enqueued, described) = (produced?, stopped?);
    let warmup_us = (WARMUP_SECS_MAX.min(ctx.opts.seconds as f64 / 5.0) * 1e6) as i64;
    let measured = workload::measure(&pool, t0 + warmup_us, t1).await?;
    let after = workload::db_work(&pool).await?;
    pool.close().await;
    case.record(enqueued, (t1 - t0 - warmup_us) as f64 / 1e6, &measured, described);
    case.record_db_work(before, after, measured.jobs_total);
    Ok(())
}

/// Reads the system's tables every [`SAMPLE_EVERY_MS`] until stopped.
struct Sampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<TableSample>>,
}

impl Sampler {
    fn start(pool: sqlx::PgPool) -> Sampler {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut series = Vec::new();
            loop {
                if let Ok(mut sample) = workload::sample_tables(&pool).await {
                    sample.t_s = started.elapsed().as_secs_f64();
                    series.push(sample);
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(SAMPLE_EVERY_MS)) => {}
                    _ = stopped.changed() => return series,
                }
            }
        });
        Sampler { stop, task }
    }

    async fn stop(self) -> Vec<TableSample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}
