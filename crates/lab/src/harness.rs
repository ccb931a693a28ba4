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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use settled_engine::{
    ClaimedJob, HandlerError, JobHandler, LeaseConfig, LeasedJobHandler, NewJob, Queue, ServeConfig, ServeStats,
};
use sqlx::{Connection, PgConnection, PgPool};

use crate::bench::continuous::{parse_token, Pacer, ServeMode};

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

/// Pickup latencies of the last window, in per-second HDR histograms
/// (bounded memory over any run length).
pub struct PickupWindow {
    buckets: Mutex<VecDeque<(Instant, hdrhistogram::Histogram<u64>)>>,
    window: Duration,
}

impl PickupWindow {
    fn new(window: Duration) -> PickupWindow {
        PickupWindow {
            buckets: Mutex::new(VecDeque::new()),
            window,
        }
    }

    fn record(&self, seconds: f64) {
        let us = ((seconds.max(0.0) * 1e6) as u64).clamp(1, PICKUP_MAX_US);
        let mut buckets = self.buckets.lock().expect("pickup window");
        let now = Instant::now();
        let fresh = buckets
            .back()
            .is_some_and(|(at, _)| now.duration_since(*at) < Duration::from_millis(BUCKET_MS));
        if !fresh {
            let h = hdrhistogram::Histogram::new_with_bounds(1, PICKUP_MAX_US, 3).expect("valid bounds");
            buckets.push_back((now, h));
        }
        if let Some((_, h)) = buckets.back_mut() {
            h.saturating_record(us);
        }
    }

    /// p50, p95 and p99 in ms over the window (None when nothing was claimed).
    fn percentiles(&self) -> Option<(f64, f64, f64)> {
        let mut buckets = self.buckets.lock().expect("pickup window");
        while buckets.front().is_some_and(|(at, _)| at.elapsed() > self.window) {
            buckets.pop_front();
        }
        let mut all = hdrhistogram::Histogram::<u64>::new_with_bounds(1, PICKUP_MAX_US, 3).expect("valid bounds");
        for (_, h) in buckets.iter() {
            all.add(h).ok()?;
        }
        if all.is_empty() {
            return None;
        }
        let ms = |q: f64| all.value_at_quantile(q) as f64 / 1000.0;
        Some((ms(0.50), ms(0.95), ms(0.99)))
    }
}

/// Feeds the engine's pickup-latency histogram into the window.
struct PickupRecorder(Arc<PickupWindow>);

struct PickupHistogram(Arc<PickupWindow>);

impl metrics::HistogramFn for PickupHistogram {
    fn record(&self, value: f64) {
        self.0.record(value);
    }
}

impl metrics::Recorder for PickupRecorder {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        if key.name() == settled_engine::raw::telemetry::PICKUP_LATENCY {
            metrics::Histogram::from_arc(Arc::new(PickupHistogram(self.0.clone())))
        } else {
            metrics::Histogram::noop()
        }
    }
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
    metrics::set_global_recorder(PickupRecorder(pickup.clone()))
        .map_err(|_| anyhow::anyhow!("a metrics recorder is already installed"))?;
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

/// Enqueues `n` jobs with one bulk statement. Their keys follow the count
/// of jobs enqueued, so a retry after a lost answer enqueues nothing twice.
async fn enqueue(shared: &Shared, conn: &mut PgConnection, n: u64) -> anyhow::Result<()> {
    let first = shared.enqueued.load(Ordering::Relaxed);
    let jobs = (first..first + n)
        .map(|seq| {
            NewJob::new(format!("{}-{seq}", shared.key_prefix))
                .payload(&serde_json::json!({ "seq": seq, "padding": shared.padding }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    shared.queue.enqueue_many(conn, &jobs).await?;
    shared.enqueued.fetch_add(n, Ordering::Relaxed);
    Ok(())
}

/// Shortest pause of the producer after a failure.
pub const PRODUCER_BACKOFF_MIN_MS: u64 = 250;
/// Longest pause of the producer after failures.
pub const PRODUCER_BACKOFF_MAX_MS: u64 = 5_000;

/// The producer's connection through database outages (a restart, lost
/// connections): a failed statement drops it, and the next statement takes
/// a new one after a pause that doubles up to [`PRODUCER_BACKOFF_MAX_MS`].
/// One line when the producer starts failing, one when it works again.
struct Link {
    conn: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
    failing_since: Option<Instant>,
    pause: Duration,
}

impl Link {
    fn new() -> Link {
        Link {
            conn: None,
            failing_since: None,
            pause: Duration::from_millis(PRODUCER_BACKOFF_MIN_MS),
        }
    }

    async fn conn(&mut self, pool: &PgPool) -> anyhow::Result<&mut PgConnection> {
        if self.conn.is_none() {
            self.conn = Some(pool.acquire().await?);
        }
        Ok(self.conn.as_deref_mut().expect("a connection was just taken"))
    }

    fn worked(&mut self) {
        if let Some(since) = self.failing_since.take() {
            let down_secs = since.elapsed().as_secs_f64();
            tracing::info!(down_secs, "the producer works again");
        }
        self.pause = Duration::from_millis(PRODUCER_BACKOFF_MIN_MS);
    }

    async fn failed(&mut self, err: anyhow::Error) {
        self.conn = None;
        if self.failing_since.is_none() {
            self.failing_since = Some(Instant::now());
            tracing::warn!(error = %format!("{err:#}"), "the producer failed; retrying with backoff");
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(PRODUCER_BACKOFF_MAX_MS));
    }
}

/// Enqueues `n` jobs, retrying through failures until they are in or the
/// adapter stops.
async fn enqueue_through_outages(shared: &Shared, link: &mut Link, n: u64) {
    while !shared.stop.load(Ordering::Relaxed) {
        let done = match link.conn(&shared.pool).await {
            Ok(conn) => enqueue(shared, conn, n).await,
            Err(err) => Err(err),
        };
        match done {
            Ok(()) => return link.worked(),
            Err(err) => link.failed(err).await,
        }
    }
}

/// The producer: runner-paced tokens, its own clock, or a target depth.
/// It never stops on a database error: it waits the outage out.
async fn produce(shared: Arc<Shared>) {
    match (shared.env.producer_mode.as_str(), shared.env.producer_pacing.as_str()) {
        ("fixed", "harness") => produce_from_tokens(&shared).await,
        ("fixed", _) => produce_paced(&shared).await,
        _ => produce_to_depth(&shared).await,
    }
}

async fn produce_from_tokens(shared: &Shared) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(1024);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            if let Some(n) = parse_token(&line) {
                if tx.blocking_send(n).is_err() {
                    return;
                }
            }
        }
    });
    let mut link = Link::new();
    while let Some(n) = rx.recv().await {
        enqueue_through_outages(shared, &mut link, n.min(shared.env.producer_batch_max)).await;
    }
}

async fn produce_paced(shared: &Shared) {
    let env = &shared.env;
    let mut pacer = Pacer::with(
        env.producer_rate,
        Duration::from_millis(env.producer_batch_ms),
        env.producer_batch_max,
    );
    let mut link = Link::new();
    while !shared.stop.load(Ordering::Relaxed) {
        for n in pacer.next().await {
            enqueue_through_outages(shared, &mut link, n).await;
        }
    }
}

async fn produce_to_depth(shared: &Shared) {
    let mut link = Link::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let ready = match link.conn(&shared.pool).await {
            Ok(conn) => shared.queue.stats(conn).await.map_err(anyhow::Error::from),
            Err(err) => Err(err),
        };
        let ready = match ready {
            Ok(stats) => stats.ready.max(0) as u64,
            Err(err) => {
                link.failed(err).await;
                continue;
            }
        };
        link.worked();
        if ready < shared.env.target_depth {
            let n = (shared.env.target_depth - ready).min(shared.env.producer_batch_max);
            enqueue_through_outages(shared, &mut link, n).await;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Emits the samples every SAMPLE_EVERY_S, the first on a wall-clock boundary.
async fn sample(shared: Arc<Shared>) {
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

fn now_iso() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn metric_line(shared: &Shared, metric: &str, value: f64, window_s: f64) -> serde_json::Value {
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

fn descriptor(shared: &Shared) -> serde_json::Value {
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
fn emit(record: &serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{record}");
    let _ = out.flush();
}
