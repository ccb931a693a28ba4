//! Serving a continuous queue until stopped, in either mode: `tx.rs` (the
//! handler's effects and the jobs' completion commit together) or
//! `leased.rs` (leases renewed while the work runs, fenced completion).
//! Both run claim loops that sleep when the queue is empty and wake on the
//! queue's notification (`wake.rs`) or, as a fallback, on a poll; beside
//! them run the rescuer of expired leases and the retention pruner. A loop
//! rides out a restart or failover of the database (it backs off and
//! retries, and the listener reconnects), and a stop lets the work in
//! hand finish (leased: for a grace period, then gives the rest back).
//! `spans.rs` names the spans of claims and jobs.

mod failure;
mod leased;
mod spans;
mod tx;
mod wake;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use sqlx::{PgConnection, PgPool};
use tokio::sync::Notify;
use uuid::Uuid;

pub use super::retention::Retention;
use super::{ClaimedJob, Queue, MAX_BATCH_JOBS};
use crate::common::backoff::{Backoff, MAX_CONCURRENCY};
use crate::common::error::{EngineError, HandlerError};
use crate::common::lease::{check_lease_config, LeaseConfig};
use crate::common::loops::run_loops;
use crate::common::outage::OutageClock;
use crate::common::retry::{FailOutcome, RetryPolicy};

/// The application's work for a job in in-transaction mode.
pub trait JobHandler: Send + Sync + 'static {
    /// Does the job's effects on `tx`, the transaction that claimed it;
    /// never commits. The engine completes the job in the same transaction,
    /// so effect and completion commit together or not at all. An error
    /// rolls the effects back and records a failed attempt.
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        job: &'a ClaimedJob,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;
}

/// The application's work for a job in leased mode.
pub trait LeasedJobHandler: Send + Sync + 'static {
    /// What the work hands to the completion (a provider's id...).
    type Output: Clone + Send + Sync + 'static;

    /// Does the job's work outside any transaction while its lease is
    /// renewed. It may run again after a crash or a lost lease, so it must
    /// be idempotent: send the job's key (or one derived from it) as the
    /// idempotency key of any external call.
    fn work<'a>(&'a self, job: &'a ClaimedJob) -> impl Future<Output = Result<Self::Output, HandlerError>> + Send + 'a;

    /// Writes the effects of the jobs whose fence still held, in the
    /// transaction that settles them; never commits. Nothing by default.
    fn complete<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        done: &'a [(ClaimedJob, Self::Output)],
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a {
        let _ = (tx, done);
        async { Ok(()) }
    }
}

/// How an idle loop learns of new jobs.
#[derive(Debug, Clone, Default)]
pub enum Wake {
    /// LISTEN on a connection of its own, opened like the serving pool's,
    /// with [`ServeConfig::poll`] as a fallback.
    #[default]
    Listen,
    /// LISTEN on a connection opened like this pool's (a direct URL when
    /// the serving pool goes through a transaction pooler).
    ListenVia(PgPool),
    /// Poll only, every [`ServeConfig::poll`] (behind a transaction pooler
    /// with no direct URL, where LISTEN cannot work).
    Poll,
}

/// How to serve a queue.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// This worker's id (the leases' owner).
    pub worker: Uuid,
    /// Claim loops in this process (1..=256).
    pub concurrency: u32,
    /// Jobs per claim (1..=[`MAX_BATCH_JOBS`]).
    pub batch: u32,
    /// How an idle loop wakes.
    pub wake: Wake,
    /// Longest sleep of an idle loop (the fallback poll; also how soon a
    /// job whose `not_before` has come is noticed).
    pub poll: Duration,
    /// Attempts and backoff of failed jobs.
    pub retry: RetryPolicy,
    /// Leases (leased mode), the rescuer's interval and the stop's grace.
    pub lease: LeaseConfig,
    /// Finished jobs' retention (None: this worker never prunes).
    pub retention: Option<Retention>,
    /// Longest the database may be away before the loops give up.
    pub max_outage: Duration,
    /// Failures in a row (not transient) before a loop gives up.
    pub max_consecutive_failures: u32,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            worker: Uuid::new_v4(),
            concurrency: 4,
            batch: 1,
            wake: Wake::Listen,
            poll: Duration::from_secs(1),
            retry: RetryPolicy {
                max_attempts: 10,
                backoff_base_ms: 1_000,
                backoff_cap_ms: 3_600_000,
            },
            lease: LeaseConfig::default(),
            retention: Some(Retention::default()),
            max_outage: Duration::from_secs(900),
            max_consecutive_failures: 10,
        }
    }
}

impl ServeConfig {
    fn check(&self) -> Result<(), EngineError> {
        let bad = |what: String| Err(EngineError::Config(what));
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return bad(format!(
                "concurrency must be 1..={MAX_CONCURRENCY}, got {}",
                self.concurrency
            ));
        }
        if !(1..=MAX_BATCH_JOBS).contains(&self.batch) {
            return bad(format!("batch must be 1..={MAX_BATCH_JOBS}, got {}", self.batch));
        }
        if self.poll.is_zero() {
            return bad("poll must be longer than 0".into());
        }
        check_lease_config(&self.lease)
    }
}

/// Counters of one serving process, and its stop switch.
#[derive(Debug, Default)]
pub struct ServeStats {
    /// Jobs claimed.
    pub claimed: AtomicU64,
    /// Jobs settled by this process.
    pub settled: AtomicU64,
    /// Failed attempts sent back to retry later.
    pub retried: AtomicU64,
    /// Jobs that failed for good (dead letters).
    pub failed: AtomicU64,
    /// Jobs snoozed (back later, no attempt spent).
    pub snoozed: AtomicU64,
    /// Completions refused because the job's fence had moved on.
    pub fence_rejections: AtomicU64,
    /// Expired leases this process's rescuer sent back or failed.
    pub rescued: AtomicU64,
    /// Leases given back at a stop.
    pub released: AtomicU64,
    /// Finished jobs this process removed.
    pub pruned: AtomicU64,
    stop: AtomicBool,
    stopping: Notify,
    outage: OutageClock,
}

impl ServeStats {
    /// Asks every loop to stop: no new claims; work in hand finishes.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stopping.notify_waiters();
    }

    /// True once a stop was requested.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn count(&self, queue: &Queue, outcome: &'static str, counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
            metrics::counter!(crate::common::telemetry::JOBS, "queue" => queue.name().to_string(), "outcome" => outcome)
                .increment(n);
        }
    }
}

/// Serves `queue` in in-transaction mode with `handler` until
/// `stats.request_stop()`; returns once every loop has stopped.
pub async fn serve<H: JobHandler>(
    pool: &PgPool,
    queue: Arc<Queue>,
    handler: Arc<H>,
    cfg: ServeConfig,
    stats: Arc<ServeStats>,
) -> Result<(), EngineError> {
    let ctx = Ctx::start(pool, queue, cfg, stats).await?;
    ctx.run_loops(|| {
        let (ctx, handler) = (ctx.clone(), handler.clone());
        async move { ctx.run(|| tx::step(&ctx, &*handler)).await }
    })
    .await
}

/// Serves `queue` in leased mode with `handler` until
/// `stats.request_stop()`, then lets work in hand finish for the lease
/// config's grace and gives back what is left.
pub async fn serve_leased<H: LeasedJobHandler>(
    pool: &PgPool,
    queue: Arc<Queue>,
    handler: Arc<H>,
    cfg: ServeConfig,
    stats: Arc<ServeStats>,
) -> Result<(), EngineError> {
    let ctx = Ctx::start(pool, queue, cfg, stats).await?;
    leased::serve(ctx, handler).await
}

/// What every loop of one serve shares.
#[derive(Clone)]
pub(crate) struct Ctx {
    pool: PgPool,
    queue: Arc<Queue>,
    cfg: ServeConfig,
    stats: Arc<ServeStats>,
    woken: Arc<Notify>,
    background: Arc<Vec<tokio::task::AbortHandle>>,
}

/// What one step of a loop did.
pub(crate) enum Step {
    /// Claimed and handled jobs: claim again at once.
    Worked,
    /// Nothing to claim: sleep until woken.
    Idle,
}

impl Ctx {
    /// Checks the config and the table, and starts the listener, the
    /// rescuer and the pruner.
    async fn start(
        pool: &PgPool,
        queue: Arc<Queue>,
        cfg: ServeConfig,
        stats: Arc<ServeStats>,
    ) -> Result<Ctx, EngineError> {
        cfg.check()?;
        let mut conn = pool
            .acquire()
            .await
            .map_err(EngineError::db("acquiring a connection"))?;
        queue.declare(&mut conn).await?;
        drop(conn);
        let woken = Arc::new(Notify::new());
        let mut background = vec![tokio::spawn(wake::listen(
            pool.clone(),
            cfg.wake.clone(),
            queue.clone(),
            woken.clone(),
        ))
        .abort_handle()];
        background
            .push(tokio::spawn(keep_rescuing(pool.clone(), queue.clone(), cfg.clone(), stats.clone())).abort_handle());
        if let Some(retention) = cfg.retention {
            background
                .push(tokio::spawn(keep_pruning(pool.clone(), queue.clone(), retention, stats.clone())).abort_handle());
        }
        Ok(Ctx {
            pool: pool.clone(),
            queue,
            cfg,
            stats,
            woken,
            background: Arc::new(background),
        })
    }

    /// Runs `cfg.concurrency` loops, each the future `spawn_one` returns,
    /// until every one has stopped (one failing stops the rest), then stops
    /// the background tasks.
    async fn run_loops<F, Fut>(&self, spawn_one: F) -> Result<(), EngineError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), EngineError>> + Send + 'static,
    {
        let stop = || self.stats.request_stop();
        let result = run_loops(self.cfg.concurrency, "serve loop", spawn_one, stop).await;
        for task in self.background.iter() {
            task.abort();
        }
        result
    }

    /// Repeats `step` until stopped: at once after work, after a wake-up or
    /// the poll when idle, after a backoff when it failed.
    async fn run<F, Fut>(&self, mut step: F) -> Result<(), EngineError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Step, EngineError>>,
    {
        let mut backoff = Backoff::new(
            self.cfg.max_consecutive_failures,
            self.cfg.max_outage,
            &self.stats.outage,
        );
        while !self.stats.stopped() {
            // Registered before the claim, so a commit between an empty
            // claim and the sleep still wakes it.
            let woken = self.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            match step().await {
                Ok(step) => {
                    if let Some(retries) = backoff.succeeded(matches!(step, Step::Worked)) {
                        tracing::info!(queue = self.queue.name(), retries, "serve loop working again");
                    }
                    if matches!(step, Step::Idle) {
                        self.sleep(woken, self.cfg.poll).await;
                    }
                }
                Err(err) if err.is_fatal() => return Err(err),
                Err(err) => {
                    let pause = backoff.failed(&err)?;
                    if pause.say {
                        tracing::warn!(queue = self.queue.name(), transient = err.is_transient(), error = %err, "serve step failed");
                    }
                    tokio::time::sleep(pause.sleep).await;
                }
            }
        }
        Ok(())
    }

    /// Sleeps until woken, `most` has passed, or a stop.
    async fn sleep(&self, woken: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>, most: Duration) {
        let stopping = self.stats.stopping.notified();
        tokio::select! {
            _ = woken => {}
            _ = stopping => {}
            _ = tokio::time::sleep(most) => {}
        }
    }

    /// A pooled connection, waited for no longer than the outage limit allows.
    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, EngineError> {
        self.stats.outage.acquire(&self.pool, self.cfg.max_outage).await
    }

    /// Records a claim: its time, and how long each job waited for it.
    fn claimed(&self, mode: &'static str, took: Duration, jobs: &[(ClaimedJob, Duration)]) {
        let queue = self.queue.name().to_string();
        metrics::histogram!(crate::common::telemetry::CLAIM_DURATION, "mode" => mode, "queue" => queue.clone())
            .record(took.as_secs_f64());
        let pickup = metrics::histogram!(crate::common::telemetry::PICKUP_LATENCY, "queue" => queue);
        for (_, waited) in jobs {
            pickup.record(waited.as_secs_f64());
        }
        self.stats.claimed.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        // A full batch says more may be waiting: wake one more loop to
        // claim beside this one. Each woken loop that also fills its batch
        // wakes the next, so the loops at work grow with the backlog
        // instead of every loop waking for every commit.
        if jobs.len() >= self.cfg.batch as usize {
            self.woken.notify_one();
        }
    }
}

/// Runs a handler's future; a panic becomes a failed attempt of its job.
pub(crate) async fn guarded<T>(
    job: &ClaimedJob,
    work: impl Future<Output = Result<T, HandlerError>>,
) -> Result<T, HandlerError> {
    let started = Instant::now();
    let result = AssertUnwindSafe(work).catch_unwind().await.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-text panic".into());
        Err(HandlerError::Transient(format!(
            "handler panicked on job {}: {what}",
            job.key
        )))
    });
    metrics::histogram!(crate::common::telemetry::HANDLER_DURATION, "mode" => "job")
        .record(started.elapsed().as_secs_f64());
    result
}

/// Sends expired leases back (or to `failed`) every rescue interval.
async fn keep_rescuing(pool: PgPool, queue: Arc<Queue>, cfg: ServeConfig, stats: Arc<ServeStats>) {
    let mut tick = tokio::time::interval(cfg.lease.rescue_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match rescue_once(&pool, &queue, &cfg.retry).await {
            Ok(Some(outcome)) if outcome.retried + outcome.failed > 0 => {
                stats.count(&queue, "rescued", &stats.rescued, outcome.retried + outcome.failed);
                stats.count(&queue, "failed", &stats.failed, outcome.failed);
                tracing::warn!(
                    queue = queue.name(),
                    retried = outcome.retried,
                    failed = outcome.failed,
                    "rescued expired leases"
                );
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(queue = queue.name(), error = %err, "rescue failed"),
        }
    }
}

/// One rescue, unless another worker is rescuing this queue (None).
pub async fn rescue_once(
    pool: &PgPool,
    queue: &Queue,
    policy: &RetryPolicy,
) -> Result<Option<FailOutcome>, EngineError> {
    let mut tx = pool.begin().await.map_err(EngineError::db("beginning a rescue"))?;
    let ours: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('settled-engine-rescue'), hashtext($1))")
            .bind(queue.name()) // $1
            .fetch_one(&mut *tx)
            .await
            .map_err(EngineError::db("taking the rescuer lock"))?;
    if !ours {
        return Ok(None);
    }
    let outcome = queue.rescue_expired(&mut tx, policy).await?;
    tx.commit().await.map_err(EngineError::db("committing a rescue"))?;
    Ok(Some(outcome))
}

/// Prunes finished jobs every retention interval.
async fn keep_pruning(pool: PgPool, queue: Arc<Queue>, retention: Retention, stats: Arc<ServeStats>) {
    let mut tick = tokio::time::interval(retention.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match queue.prune(&pool, &retention).await {
            Ok(Some(removed)) => stats.count(&queue, "pruned", &stats.pruned, removed),
            Ok(None) => {}
            Err(err) => tracing::warn!(queue = queue.name(), error = %err, "prune failed"),
        }
    }
}
