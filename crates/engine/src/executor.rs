//! The in-transaction claim loop: claim a chunk, run the application's
//! handler on the same transaction, mark the chunk settled, commit.
//!
//! A crash anywhere before the commit rolls everything back and releases the
//! row locks at once; there is nothing to rescue. Many loops (tasks in one
//! process, processes on many hosts) run side by side: `SKIP LOCKED` gives
//! each one different rows, and nobody waits for anybody.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use crate::queue::MAX_CHUNK_ITEMS;
use crate::{EngineError, HandlerError, WorkQueue};

/// Largest number of claim loops one process may run.
pub const MAX_CONCURRENCY: u32 = 256;
/// Longest pause between two retries after failures.
pub const MAX_RETRY_BACKOFF_MS: u64 = 5_000;

/// One claimed item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedItem {
    /// The item's key, as text.
    pub key: String,
    /// The attempt number this claim represents (the item's fence).
    pub fence: i32,
}

/// The items one claim took, all of one run and scope.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The run the chunk belongs to.
    pub run_id: i64,
    /// The scope value (e.g. the period) as text.
    pub scope: String,
    /// The claimed items.
    pub items: Vec<ClaimedItem>,
}

impl Chunk {
    /// The items' keys, in claim order.
    pub fn keys(&self) -> Vec<String> {
        self.items.iter().map(|i| i.key.clone()).collect()
    }
}

/// The application's work for a chunk, done on the claiming transaction.
///
/// It must do its effects with set-based statements on `tx` (one statement
/// per chunk, not per item) and must not commit: the engine marks the items
/// settled and commits, so effects and status change commit together or not
/// at all.
pub trait ChunkHandler: Send + Sync + 'static {
    /// Performs the chunk's effects inside the claiming transaction.
    fn handle_chunk<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        chunk: &'a Chunk,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;
}

/// How to drain a run.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    /// Items per claim (1..=[`MAX_CHUNK_ITEMS`]).
    pub chunk: u32,
    /// Claim loops in this process (1..=[`MAX_CONCURRENCY`]).
    pub concurrency: u32,
    /// Pause when nothing is claimable but work remains (others hold it).
    pub idle_poll: Duration,
    /// Consecutive failures of one loop before it gives up.
    pub max_consecutive_failures: u32,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            chunk: 100,
            concurrency: 4,
            idle_poll: Duration::from_millis(50),
            max_consecutive_failures: 10,
        }
    }
}

/// Counters a drain updates as it goes (shared with progress displays).
#[derive(Debug, Default)]
pub struct DrainStats {
    /// Items this process settled.
    pub items_settled: AtomicU64,
    /// Chunks this process committed.
    pub chunks_committed: AtomicU64,
    /// Chunks rolled back after an error.
    pub chunks_rolled_back: AtomicU64,
    /// Total time spent in claim statements, in microseconds.
    pub claim_micros: AtomicU64,
    /// Set to stop claiming new chunks (the current ones finish).
    pub stop: AtomicBool,
}

/// Drains `scope` of run `run_id` with `cfg.concurrency` claim loops until no
/// eligible or processing item is left (or the run stops running).
pub async fn drain_in_transactions<H: ChunkHandler>(
    pool: &PgPool,
    queue: Arc<WorkQueue>,
    run_id: i64,
    scope: &str,
    handler: Arc<H>,
    cfg: &DrainConfig,
    stats: Arc<DrainStats>,
) -> Result<(), EngineError> {
    if cfg.chunk == 0 || cfg.chunk > MAX_CHUNK_ITEMS {
        return Err(EngineError::Invariant(format!(
            "chunk must be 1..={MAX_CHUNK_ITEMS}, got {}",
            cfg.chunk
        )));
    }
    if cfg.concurrency == 0 || cfg.concurrency > MAX_CONCURRENCY {
        return Err(EngineError::Invariant(format!(
            "concurrency must be 1..={MAX_CONCURRENCY}, got {}",
            cfg.concurrency
        )));
    }
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..cfg.concurrency {
        let (pool, queue, handler, stats, cfg, scope) = (
            pool.clone(),
            queue.clone(),
            handler.clone(),
            stats.clone(),
            cfg.clone(),
            scope.to_string(),
        );
        loops.spawn(async move {
            claim_loop(&pool, &queue, run_id, &scope, &*handler, &cfg, &stats).await
        });
    }
    let mut first_error = None;
    while let Some(joined) = loops.join_next().await {
        let result = joined
            .unwrap_or_else(|e| Err(EngineError::Invariant(format!("claim loop panicked: {e}"))));
        if let Err(err) = result {
            stats.stop.store(true, Ordering::Relaxed);
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
}

enum Step {
    Settled(usize),
    Drained,
    Idle,
}

async fn claim_loop<H: ChunkHandler>(
    pool: &PgPool,
    queue: &WorkQueue,
    run_id: i64,
    scope: &str,
    handler: &H,
    cfg: &DrainConfig,
    stats: &DrainStats,
) -> Result<(), EngineError> {
    let mut failures = 0u32;
    while !stats.stop.load(Ordering::Relaxed) {
        match settle_one_chunk(pool, queue, run_id, scope, handler, cfg, stats).await {
            Ok(Step::Settled(n)) => {
                failures = 0;
                stats.items_settled.fetch_add(n as u64, Ordering::Relaxed);
                stats.chunks_committed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Step::Drained) => return Ok(()),
            Ok(Step::Idle) => tokio::time::sleep(cfg.idle_poll).await,
            Err(err) => {
                failures += 1;
                stats.chunks_rolled_back.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(run = run_id, period = scope, failures, error = %err, "chunk rolled back");
                if failures >= cfg.max_consecutive_failures {
                    return Err(EngineError::TooManyFailures {
                        attempts: failures,
                        last: err.to_string(),
                    });
                }
                let backoff = (50u64 << failures.min(10)).min(MAX_RETRY_BACKOFF_MS);
                tokio::time::sleep(Duration::from_millis(backoff)).await;
            }
        }
    }
    Ok(())
}

/// One transaction: claim, handle, mark settled, commit.
async fn settle_one_chunk<H: ChunkHandler>(
    pool: &PgPool,
    queue: &WorkQueue,
    run_id: i64,
    scope: &str,
    handler: &H,
    cfg: &DrainConfig,
    stats: &DrainStats,
) -> Result<Step, EngineError> {
    let mut tx = pool
        .begin()
        .await
        .map_err(EngineError::db("beginning a transaction"))?;
    let started = Instant::now();
    let claimed = queue
        .claim_chunk_in_tx(&mut tx, scope, cfg.chunk, run_id)
        .await?;
    stats
        .claim_micros
        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    if claimed.is_empty() {
        // Nothing claimable: either done, or others hold the rest (or it waits
        // for a retry time). Decide from committed state, not from SKIP LOCKED.
        let left = queue.count_unfinished(&mut tx, scope).await?;
        let running = crate::runs::is_running(&mut tx, run_id).await?;
        tx.rollback()
            .await
            .map_err(EngineError::db("ending an empty claim"))?;
        return Ok(if left == 0 || !running {
            Step::Drained
        } else {
            Step::Idle
        });
    }
    let chunk = Chunk {
        run_id,
        scope: scope.to_string(),
        items: claimed
            .into_iter()
            .map(|(key, fence)| ClaimedItem { key, fence })
            .collect(),
    };
    if let Err(err) = handler.handle_chunk(&mut tx, &chunk).await {
        let _ = tx.rollback().await;
        return Err(EngineError::Handler {
            items: chunk.items.len(),
            first_key: chunk.items[0].key.clone(),
            source: err,
        });
    }
    queue
        .mark_settled_in_tx(&mut tx, scope, &chunk.keys())
        .await?;
    tx.commit()
        .await
        .map_err(EngineError::db("committing a chunk"))?;
    Ok(Step::Settled(chunk.items.len()))
}
