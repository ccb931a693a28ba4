//! The in-transaction claim loop: claim a chunk, run the application's
//! handler on the same transaction, mark the chunk settled, commit.
//!
//! A crash anywhere before the commit rolls everything back and releases the
//! row locks at once; there is nothing to rescue. Many loops (tasks in one
//! process, processes on many hosts) run side by side: `SKIP LOCKED` gives
//! each one different rows, and nobody waits for anybody. A chunk whose
//! handler fails is retried in halves until the failing item is alone; only
//! that item records a failed attempt.
//!
//! This module owns the loop (`run_loop`: retries, backoff, outages) and its
//! configuration; `cursor.rs` where a loop claims next, `chunk.rs` the path
//! through [`ChunkHandler::handle_chunk`], `statement.rs` the one-statement
//! path ([`crate::ChunkSql`]).

mod chunk;
mod cursor;
mod statement;

use crate::drainer::RunTarget;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

pub use chunk::ChunkHandler;

use crate::outage::OutageClock;
use crate::queue::{Failure, RetryPolicy, MAX_CHUNK_ITEMS};
use crate::ranges::RunRanges;
use crate::{EngineError, HandlerError, WorkQueue};
use cursor::ClaimCursor;

/// Largest number of claim loops one process may run.
pub const MAX_CONCURRENCY: u32 = 256;
/// Longest pause between two retries after failures.
pub const MAX_RETRY_BACKOFF_MS: u64 = 2_000;
/// How to drain a run.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    /// Items per claim (1..=[`MAX_CHUNK_ITEMS`]).
    pub chunk: u32,
    /// Claim loops in this process (1..=[`MAX_CONCURRENCY`]).
    pub concurrency: u32,
    /// Pause when nothing is claimable but work remains (others hold it).
    pub idle_poll: Duration,
    /// Consecutive non-transient failures of one loop before it gives up.
    pub max_consecutive_failures: u32,
    /// Attempts and backoff of failed items.
    pub retry: RetryPolicy,
    /// How long a loop keeps retrying while the database is away (lost
    /// connections, a restart, a failover) before it gives up with
    /// [`EngineError::Unavailable`].
    pub max_outage: Duration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            chunk: 100,
            concurrency: 4,
            idle_poll: Duration::from_millis(50),
            max_consecutive_failures: 10,
            retry: RetryPolicy::default(),
            max_outage: Duration::from_secs(900),
        }
    }
}

/// Counters a drain updates as it goes (shared with progress displays).
#[derive(Debug, Default)]
pub struct DrainStats {
    /// Items this process settled.
    pub items_settled: AtomicU64,
    /// Items this process marked held (the application refused them for now).
    pub items_held: AtomicU64,
    /// Items that went to `failed` from this process.
    pub items_failed: AtomicU64,
    /// Failed attempts sent back to retry later.
    pub items_retried: AtomicU64,
    /// Chunks this process committed.
    pub chunks_committed: AtomicU64,
    /// Chunks rolled back after an error.
    pub chunks_rolled_back: AtomicU64,
    /// Chunks split in halves to isolate a failing item.
    pub chunks_split: AtomicU64,
    /// Completions refused because the item's lease (fence) was lost.
    pub fence_rejections: AtomicU64,
    /// Expired leases this process's rescuer sent back (or failed).
    pub leases_rescued: AtomicU64,
    /// Leases given back at shutdown.
    pub leases_released: AtomicU64,
    /// Claim statements run.
    pub claims: AtomicU64,
    /// Items claimed (an item retried is claimed again).
    pub items_claimed: AtomicU64,
    /// Total time spent in claim statements, in microseconds.
    pub claim_micros: AtomicU64,
    /// Set to stop claiming new chunks (the current ones finish).
    pub stop: AtomicBool,
    /// Since when the database has been away, as this process's loops see it.
    pub outage: OutageClock,
}

impl DrainStats {
    /// Counts one claim statement and records its time (in the claim
    /// histogram, labelled with the mode, and in `claim_micros`).
    pub(crate) fn record_claim(&self, mode: &'static str, elapsed: Duration) {
        self.claims.fetch_add(1, Ordering::Relaxed);
        metrics::histogram!(crate::telemetry::CLAIM_DURATION, "mode" => mode).record(elapsed.as_secs_f64());
        self.claim_micros
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }
}

pub(crate) fn check_config(cfg: &DrainConfig) -> Result<(), EngineError> {
    if cfg.chunk == 0 || cfg.chunk > MAX_CHUNK_ITEMS {
        return Err(EngineError::Config(format!(
            "chunk must be 1..={MAX_CHUNK_ITEMS}, got {}",
            cfg.chunk
        )));
    }
    if cfg.concurrency == 0 || cfg.concurrency > MAX_CONCURRENCY {
        return Err(EngineError::Config(format!(
            "concurrency must be 1..={MAX_CONCURRENCY}, got {}",
            cfg.concurrency
        )));
    }
    Ok(())
}

/// What one claim loop works on, passed down whole: the run and scope, the
/// queue, and where its counts go.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) pool: PgPool,
    pub(crate) queue: Arc<WorkQueue>,
    pub(crate) run_id: i64,
    pub(crate) scope: String,
    pub(crate) cfg: DrainConfig,
    pub(crate) stats: Arc<DrainStats>,
}

impl Target {
    /// Repeats `step` until drained or stopped (see [`run_loop`]).
    pub(crate) async fn run<F, Fut>(&self, step: F) -> Result<(), EngineError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Step, EngineError>>,
    {
        run_loop(&self.stats, &self.cfg, self.run_id, &self.scope, step).await
    }

    /// Counts a committed chunk.
    pub(crate) fn committed(&self, settled: u64, held: u64) {
        self.stats.chunks_committed.fetch_add(1, Ordering::Relaxed);
        self.stats.items_settled.fetch_add(settled, Ordering::Relaxed);
        self.stats.items_held.fetch_add(held, Ordering::Relaxed);
    }

    /// A pooled connection, waited for no longer than the outage limit allows.
    pub(crate) async fn conn(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, EngineError> {
        self.stats.outage.acquire(&self.pool, self.cfg.max_outage).await
    }
}

/// Drains `scope` of run `run_id` with `cfg.concurrency` claim loops until no
/// eligible or processing item is left (or the run stops running, or
/// `stats.stop` is set).
pub async fn drain_in_transactions<H: ChunkHandler>(run: RunTarget<'_>, handler: Arc<H>) -> Result<(), EngineError> {
    let RunTarget {
        pool,
        run_id,
        scope,
        cfg,
        stats,
        ..
    } = run;
    check_config(cfg)?;
    let target = Target {
        pool: pool.clone(),
        queue: run.queue.clone(),
        run_id,
        scope: scope.to_string(),
        cfg: cfg.clone(),
        stats: stats.clone(),
    };
    let (ranges, statements) = {
        let mut conn = target.conn().await?;
        let ranges = RunRanges::cut(&mut conn, &target.queue, run_id, scope, cfg.chunk).await?;
        let statements = match handler.chunk_sql() {
            Some(sql) => Some(Arc::new(
                target.queue.chunk_statements_for(&mut conn, scope, &sql).await?,
            )),
            None => None,
        };
        (ranges, statements)
    };
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..cfg.concurrency {
        let (t, cursor) = (target.clone(), ClaimCursor::new(ranges));
        match &statements {
            Some(statements) => {
                let statements = statements.clone();
                loops.spawn(async move {
                    t.run(|| statement::settle_one_statement(&t, &statements, &cursor))
                        .await
                });
            }
            None => {
                let handler = handler.clone();
                loops.spawn(async move { t.run(|| chunk::settle_one_chunk(&t, &*handler, &cursor)).await });
            }
        }
    }
    join_loops(loops, stats).await
}

pub(crate) async fn join_loops(
    mut loops: tokio::task::JoinSet<Result<(), EngineError>>,
    stats: &DrainStats,
) -> Result<(), EngineError> {
    let mut first_error = None;
    while let Some(joined) = loops.join_next().await {
        let result = joined.unwrap_or_else(|e| Err(EngineError::Invariant(format!("claim loop panicked: {e}"))));
        if let Err(err) = result {
            stats.stop.store(true, Ordering::Relaxed);
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// What one step of a claim loop did.
pub(crate) enum Step {
    /// Processed a chunk.
    Worked,
    /// Found the loop's key range empty: take the next one at once.
    NextRange,
    /// Nothing left to do in the run.
    Drained,
    /// Nothing claimable now, but work remains (held by others, or waiting).
    Idle,
}

/// A loop's failures in a row and the outage it may be in: after each
/// step, whether to go on, how long to back off, or that the loop must
/// give up. Transient failures (the database restarting, a terminated
/// connection, a failover) are retried until the outage, on the process's
/// [`OutageClock`] (from the first failure any of its loops saw), lasts
/// longer than allowed; others give up after a number in a row.
#[derive(Debug)]
pub(crate) struct Backoff<'c> {
    failures: u32,
    transient_streak: u32,
    outage: &'c OutageClock,
    max_failures: u32,
    max_outage: Duration,
}

impl Backoff<'_> {
    pub(crate) fn new(max_failures: u32, max_outage: Duration, outage: &OutageClock) -> Backoff<'_> {
        Backoff {
            failures: 0,
            transient_streak: 0,
            outage,
            max_failures,
            max_outage,
        }
    }

    /// A step succeeded (`worked`: it did work, which ends a run of
    /// failures). Returns the length of the transient streak it ends.
    pub(crate) fn succeeded(&mut self, worked: bool) -> Option<u32> {
        self.outage.recovered();
        if worked {
            self.failures = 0;
        }
        let streak = std::mem::take(&mut self.transient_streak);
        (streak > 0).then_some(streak)
    }

    /// A step failed with `err`: the pause before the next step and
    /// whether to say so (a transient streak is said once, at its start),
    /// or the error that ends the loop.
    pub(crate) fn failed(&mut self, err: &EngineError) -> Result<(Duration, bool), EngineError> {
        let transient = err.is_transient();
        let mut longest = Duration::from_millis(MAX_RETRY_BACKOFF_MS);
        if transient {
            self.transient_streak += 1;
            let since = self.outage.failed(Instant::now());
            if since.elapsed() > self.max_outage {
                return Err(EngineError::Unavailable {
                    secs: since.elapsed().as_secs(),
                    last: err.to_string(),
                });
            }
            // Never past the limit: the next step then gives up at once.
            longest = longest.min(self.max_outage.saturating_sub(since.elapsed()) + Duration::from_millis(10));
        } else {
            self.failures += 1;
            if self.failures >= self.max_failures {
                return Err(EngineError::TooManyFailures {
                    attempts: self.failures,
                    last: err.to_string(),
                });
            }
        }
        let exponent = (self.failures + self.transient_streak).min(10);
        let pause = Duration::from_millis(25u64 << exponent).min(longest);
        Ok((pause, !transient || self.transient_streak == 1))
    }

    /// Failures in a row that were not transient.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

/// Repeats `step` until drained or stopped, backing off after failures
/// ([`Backoff`]); a fatal failure (a missing grant, [`EngineError::is_fatal`])
/// ends the loop at once.
pub(crate) async fn run_loop<F, Fut>(
    stats: &DrainStats,
    cfg: &DrainConfig,
    run_id: i64,
    scope: &str,
    mut step: F,
) -> Result<(), EngineError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Step, EngineError>>,
{
    let mut backoff = Backoff::new(cfg.max_consecutive_failures, cfg.max_outage, &stats.outage);
    while !stats.stop.load(Ordering::Relaxed) {
        let stepped = step().await;
        if let Ok(step) = &stepped {
            if let Some(retries) = backoff.succeeded(matches!(step, Step::Worked)) {
                // One line when the database is back, not one per attempt.
                tracing::info!(run = run_id, scope, retries, "claim loop working again");
            }
        }
        match stepped {
            Ok(Step::Worked | Step::NextRange) => {}
            Ok(Step::Drained) => return Ok(()),
            Ok(Step::Idle) => tokio::time::sleep(cfg.idle_poll).await,
            Err(err) => {
                stats.chunks_rolled_back.fetch_add(1, Ordering::Relaxed);
                if err.is_fatal() {
                    // No retry can succeed, and no item is at fault: stop every loop.
                    return Err(err);
                }
                let (pause, say) = backoff.failed(&err)?;
                if say {
                    let (transient, failures) = (err.is_transient(), backoff.failures());
                    tracing::warn!(run = run_id, scope, transient, failures, error = %err, "chunk rolled back");
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
    Ok(())
}

/// After an empty claim: done, or others hold the rest (or it waits for a
/// retry time)? Decided from committed state, never from SKIP LOCKED.
pub(crate) async fn idle_or_drained(
    conn: &mut PgConnection,
    queue: &WorkQueue,
    run_id: i64,
    scope: &str,
) -> Result<Step, EngineError> {
    let left = queue.has_unfinished(conn, scope).await?;
    let running = crate::runs::is_running(conn, run_id).await?;
    Ok(if !left || !running { Step::Drained } else { Step::Idle })
}

/// Records the failure of an item found failing alone (retried later, or
/// failed for good once its attempts are spent); true when it failed for good.
async fn fail_alone(t: &Target, key: &str, err: &HandlerError) -> Result<bool, EngineError> {
    let mut conn = t.conn().await?;
    let outcome = t
        .queue
        .fail_unclaimed(
            &mut conn,
            &t.scope,
            &[key.to_string()],
            Failure {
                error: &err.to_string(),
                permanent: err.is_permanent(),
            },
            &t.cfg.retry,
        )
        .await?;
    t.stats.items_failed.fetch_add(outcome.failed, Ordering::Relaxed);
    t.stats.items_retried.fetch_add(outcome.retried, Ordering::Relaxed);
    Ok(outcome.failed == 1)
}
