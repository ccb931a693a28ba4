//! `settled lab harness-adapter`: settled's engine as an adapter of the
//! public PostgreSQL job-queue benchmark's long-horizon runner, in either
//! mode. It reads the runner's environment, installs the engine and one
//! queue with their own migrations, serves the queue in this process with
//! WORKER_COUNT claim loops, produces (paced by the runner's `ENQUEUE n`
//! lines on stdin, by its own clock, or to a target depth), and writes
//! JSONL to stdout: one descriptor, then every SAMPLE_EVERY_S (aligned to
//! the wall clock) the pickup latency percentiles of the last 30 s, the
//! enqueue and completion rates and the queue depth. Logs go to stderr.
//! SIGTERM (or SIGINT) stops it, exit 0, within 5 s.
//!
//! A database outage (a restart, lost connections) stops nothing: the
//! claim loops and the producer retry with backoff and carry on when the
//! database is back, each saying so once when it starts failing and once
//! when it works again; meanwhile samples go on, without the depth.
//!
//! Pickup latency is the engine's own `work_queue_pickup_latency_seconds`:
//! from the enqueuing transaction to the claim, on the database's clock.

mod pickup;
mod produce;
mod sample;

pub use pickup::PickupWindow;
use produce::produce;

pub use produce::{PRODUCER_BACKOFF_MAX_MS, PRODUCER_BACKOFF_MIN_MS};
use sample::{descriptor, emit, sample};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use settled_engine::{
    ClaimedJob, HandlerError, JobHandler, LeaseConfig, LeasedJobHandler, Queue, ServeConfig, ServeStats,
};
use sqlx::{Connection, PgConnection, PgPool};

use crate::bench::continuous::ServeMode;
use crate::histogram_recorder::OneHistogram;

/// The queue the adapter serves, and its table (the descriptor's event table).
pub const QUEUE_NAME: &str = "harness";
/// Its table.
pub const QUEUE_TABLE: &str = "settled_harness.jobs";
/// Longest the stop may take before the process exits anyway (the contract allows 5 s).
pub const STOP_BUDGET_MS: u64 = 3_500;
/// How long pickup latencies are kept per bucket of the rolling window.
pub const BUCKET_MS: u64 = 1_000;
/// Largest pickup latency recorded, µs (longer ones are clamped).
pub const PICKUP_MAX_US: u64 = 3_600_000_000;

/// The runner's environment, with the contract's defaults.
#[derive(Debug, Clone)]
pub struct HarnessEnv {
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `SCENARIO`.
    pub scenario: String,
    /// `PRODUCER_MODE`: fixed or depth-target.
    pub producer_mode: String,
    /// `PRODUCER_RATE`, jobs/s.
    pub producer_rate: u64,
    /// `PRODUCER_PACING`: who paces the producer, harness or adapter.
    pub producer_pacing: String,
    /// `PRODUCER_BATCH_MAX`: most jobs per enqueue.
    pub producer_batch_max: u64,
    /// `PRODUCER_BATCH_MS`: longest wait to fill a batch.
    pub producer_batch_ms: u64,
    /// `TARGET_DEPTH`: the depth-target producer's queue depth.
    pub target_depth: u64,
    /// `WORKER_COUNT`: claim loops.
    pub worker_count: u32,
    /// `PAYLOAD_BYTES`: each job's payload.
    pub payload_bytes: usize,
    /// `WORK_MS`: each job's work.
    pub work_ms: u64,
    /// `SAMPLE_EVERY_S`: seconds between samples.
    pub sample_every_s: u64,
    /// `LATENCY_WINDOW_MS`: the window of the latency percentiles.
    pub latency_window_ms: u64,
    /// `BENCH_INSTANCE_ID`: this adapter among several.
    pub instance_id: u32,
    /// Jobs per claim (`SETTLED_BATCH`; by default [`default_batch`] of
    /// the mode).
    pub batch: u32,
}

/// Jobs per claim by default in tx mode: the work of a claim's jobs runs in
/// its transaction, one after another, so a claim holds its rows for the
/// batch's work; ten keep the transaction short and one claim's round trip
/// for ten jobs.
pub const DEFAULT_BATCH_TX: u32 = 10;
/// Jobs per claim by default in leased mode: the work runs outside any
/// transaction and concurrently, so a claim's cost (its statement, its
/// lease, its completion) is spread over more jobs. One job per claim kept
/// up with 43% of 2,000 jobs/s at W = 16; fifty with all of it
/// (docs/benchmarks.md, "The adapter's defaults").
pub const DEFAULT_BATCH_LEASED: u32 = 50;

/// Jobs per claim by default in `mode`.
pub fn default_batch(mode: ServeMode) -> u32 {
    match mode {
        ServeMode::Tx => DEFAULT_BATCH_TX,
        ServeMode::Leased => DEFAULT_BATCH_LEASED,
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a valid number")),
    }
}

impl HarnessEnv {
    /// Reads the environment for `mode`; a bad value is an error naming its
    /// variable.
    pub fn from_env(mode: ServeMode) -> anyhow::Result<HarnessEnv> {
        let env = HarnessEnv {
            database_url: var("DATABASE_URL").context("DATABASE_URL is not set")?,
            scenario: var("SCENARIO").unwrap_or_else(|| "long_horizon".into()),
            producer_mode: var("PRODUCER_MODE").unwrap_or_else(|| "fixed".into()),
            producer_rate: number("PRODUCER_RATE", 800)?,
            producer_pacing: var("PRODUCER_PACING").unwrap_or_else(|| "adapter".into()),
            producer_batch_max: number("PRODUCER_BATCH_MAX", 128u64)?.max(1),
            producer_batch_ms: number("PRODUCER_BATCH_MS", 25u64)?.max(1),
            target_depth: number("TARGET_DEPTH", 1000)?,
            worker_count: number("WORKER_COUNT", 32)?,
            payload_bytes: number("JOB_PAYLOAD_BYTES", 256)?,
            work_ms: number("JOB_WORK_MS", 1)?,
            sample_every_s: number("SAMPLE_EVERY_S", 5u64)?.max(1),
            latency_window_ms: number("LATENCY_WINDOW_MS", 30_000u64)?.max(1),
            instance_id: number("BENCH_INSTANCE_ID", 0)?,
            batch: number("SETTLED_BATCH", default_batch(mode))?,
        };
        anyhow::ensure!(
            env.scenario == "long_horizon",
            "SCENARIO={:?}: this adapter runs long_horizon only",
            env.scenario
        );
        anyhow::ensure!(
            ["fixed", "depth-target"].contains(&env.producer_mode.as_str()),
            "PRODUCER_MODE={:?}: expected fixed or depth-target",
            env.producer_mode
        );
        anyhow::ensure!(
            ["harness", "adapter"].contains(&env.producer_pacing.as_str()),
            "PRODUCER_PACING={:?}: expected harness or adapter",
            env.producer_pacing
        );
        anyhow::ensure!(
            (1..=256).contains(&env.worker_count),
            "WORKER_COUNT={}: expected 1..=256",
            env.worker_count
        );
        anyhow::ensure!(
            (1..=10_000).contains(&env.batch),
            "SETTLED_BATCH={}: expected 1..=10000",
            env.batch
        );
        Ok(env)
    }
}

/// The queue of the adapter.
pub fn queue() -> Queue {
    Queue::new(QUEUE_NAME, QUEUE_TABLE).expect("valid queue names")
}

/// The synthetic job: JOB_WORK_MS of sleep; nothing else to commit.
struct Sleep(Duration);

impl JobHandler for Sleep {
    async fn handle(&self, _tx: &mut PgConnection, _job: &ClaimedJob) -> Result<(), HandlerError> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }
}

impl LeasedJobHandler for Sleep {
    type Output = ();

    async fn work(&self, _job: &ClaimedJob) -> Result<(), HandlerError> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }
}

/// What the adapter's tasks share.
struct Shared {
    env: HarnessEnv,
    mode: ServeMode,
    pool: PgPool,
    queue: Queue,
    enqueued: AtomicU64,
    stop: AtomicBool,
    stats: Arc<ServeStats>,
    pickup: Arc<PickupWindow>,
    key_prefix: String,
    padding: String,
}

impl Shared {
    fn system(&self) -> &'static str {
        match self.mode {
            ServeMode::Tx => "settled",
            ServeMode::Leased => "settled-leased",
        }
    }
}

/// Runs the adapter until SIGTERM or SIGINT.
pub async fn run(mode: ServeMode) -> anyhow::Result<()> {
    let env = HarnessEnv::from_env(mode)?;
    let pickup = Arc::new(PickupWindow::new(Duration::from_millis(env.latency_window_ms)));
    let window = pickup.clone();
    OneHistogram::new(settled_engine::raw::telemetry::PICKUP_LATENCY, move |secs| {
        window.record(secs)
    })
    .install()?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2 * env.worker_count + 8)
        .connect(&env.database_url)
        .await
        .context("connecting to DATABASE_URL")?;
    install(&pool).await?;
    let shared = Arc::new(Shared {
        key_prefix: format!("{}-{}", env.instance_id, uuid::Uuid::new_v4().simple()),
        padding: "x".repeat(env.payload_bytes),
        env,
        mode,
        pool,
        queue: queue(),
        enqueued: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        stats: Arc::new(ServeStats::default()),
        pickup,
    });
    emit(&descriptor(&shared));
    let serving = tokio::spawn(serve(shared.clone()));
    let producing = tokio::spawn(produce(shared.clone()));
    let sampling = tokio::spawn(sample(shared.clone()));
    signalled().await?;
    tracing::info!("stopping on a signal");
    shared.stop.store(true, Ordering::SeqCst);
    shared.stats.request_stop();
    producing.abort();
    let stopped = tokio::time::timeout(Duration::from_millis(STOP_BUDGET_MS), serving).await;
    if stopped.is_err() {
        tracing::warn!("the workers did not stop in time; what they hold comes back by itself");
    }
    sampling.abort();
    Ok(())
}

/// The engine's migrations and the queue's table, once per database.
async fn install(pool: &PgPool) -> anyhow::Result<()> {
    settled_engine::migrate(pool).await?;
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    // Replicas of the adapter may start together.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('settled-harness-install'))")
        .execute(&mut *tx)
        .await?;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(QUEUE_TABLE) // $1
        .fetch_one(&mut *tx)
        .await?;
    if !exists {
        sqlx::query("CREATE SCHEMA IF NOT EXISTS settled_harness")
            .execute(&mut *tx)
            .await?;
        queue().create_table(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Waits for SIGTERM or SIGINT.
async fn signalled() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Serves the queue with WORKER_COUNT claim loops in this process.
async fn serve(shared: Arc<Shared>) -> anyhow::Result<()> {
    let env = &shared.env;
    let cfg = ServeConfig {
        concurrency: env.worker_count,
        batch: env.batch,
        lease: LeaseConfig {
            calls_in_flight: env.worker_count as usize,
            shutdown_grace: Duration::from_secs(1),
            ..LeaseConfig::default()
        },
        ..ServeConfig::default()
    };
    let (pool, queue, stats) = (shared.pool.clone(), Arc::new(queue()), shared.stats.clone());
    let work = Arc::new(Sleep(Duration::from_millis(env.work_ms)));
    match shared.mode {
        ServeMode::Tx => settled_engine::serve(&pool, queue, work, cfg, stats).await?,
        ServeMode::Leased => settled_engine::serve_leased(&pool, queue, work, cfg, stats).await?,
    }
    Ok(())
}
