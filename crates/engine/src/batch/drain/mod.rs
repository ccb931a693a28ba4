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
//! This module owns the loop (`run_loop`: retries with the loop's
//! [`Backoff`], outages); `cursor.rs` where a loop claims next, `chunk.rs`
//! the path through [`ChunkHandler::handle_chunk`], `statement.rs` the
//! one-statement path ([`crate::ChunkSql`]).

mod chunk;
mod cursor;
mod statement;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sqlx::{PgConnection, PgPool};

pub use chunk::ChunkHandler;

use crate::batch::drainer::RunTarget;
use crate::batch::queue::{WorkQueue, MAX_CHUNK_ITEMS};
use crate::batch::ranges::RunRanges;
use crate::batch::stats::{DrainConfig, DrainStats};
use crate::common::backoff::{Backoff, MAX_CONCURRENCY};
use crate::common::error::{EngineError, HandlerError};
use crate::common::loops::run_loops;
use crate::common::retry::Failure;
use cursor::ClaimCursor;

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
    let stop = || stats.stop.store(true, Ordering::Relaxed);
    match statements {
        Some(statements) => {
            let spawn_one = || {
                let (t, cursor, statements) = (target.clone(), ClaimCursor::new(ranges), statements.clone());
                async move {
                    t.run(|| statement::settle_one_statement(&t, &statements, &cursor))
                        .await
                }
            };
            run_loops(cfg.concurrency, "claim loop", spawn_one, stop).await
        }
        None => {
            let spawn_one = || {
                let (t, cursor, handler) = (target.clone(), ClaimCursor::new(ranges), handler.clone());
                async move { t.run(|| chunk::settle_one_chunk(&t, &*handler, &cursor)).await }
            };
            run_loops(cfg.concurrency, "claim loop", spawn_one, stop).await
        }
    }
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
                let pause = backoff.failed(&err)?;
                if pause.say {
                    let (transient, failures) = (err.is_transient(), backoff.failures());
                    tracing::warn!(run = run_id, scope, transient, failures, error = %err, "chunk rolled back");
                }
                tokio::time::sleep(pause.sleep).await;
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
    let running = crate::batch::runs::is_running(conn, run_id).await?;
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
