//! The in-transaction claim loop: claim a chunk, run the application's
//! handler on the same transaction, mark the chunk settled, commit.
//!
//! A crash anywhere before the commit rolls everything back and releases the
//! row locks at once; there is nothing to rescue. Many loops (tasks in one
//! process, processes on many hosts) run side by side: `SKIP LOCKED` gives
//! each one different rows, and nobody waits for anybody. A chunk whose
//! handler fails is retried in halves until the failing item is alone; only
//! that item records a failed attempt.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};

use crate::queue::{ChunkDone, ChunkSql, ChunkStatements, Failure, KeyWindow, RetryPolicy, MAX_CHUNK_ITEMS};
use crate::ranges::{KeyRange, RunRanges};
use crate::{EngineError, Fence, HandlerError, WorkQueue};

/// Largest number of claim loops one process may run.
pub const MAX_CONCURRENCY: u32 = 256;
/// Longest pause between two retries after failures.
pub const MAX_RETRY_BACKOFF_MS: u64 = 2_000;

/// One claimed item.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimedItem {
    /// The item's key, as text.
    pub key: String,
    /// The attempt number this claim represents: record it with the effect.
    pub fence: Fence,
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

    /// The items' fences, in claim order (bind them beside [`Chunk::keys`]).
    pub fn fences(&self) -> Vec<i32> {
        self.items.iter().map(|i| i.fence.get()).collect()
    }

    /// The same chunk with other items.
    pub fn with_items(&self, items: Vec<ClaimedItem>) -> Chunk {
        Chunk {
            run_id: self.run_id,
            scope: self.scope.clone(),
            items,
        }
    }

    pub(crate) fn new(run_id: i64, scope: &str, items: Vec<ClaimedItem>) -> Chunk {
        Chunk {
            run_id,
            scope: scope.to_string(),
            items,
        }
    }
}

/// What a handler did with a chunk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handled {
    /// Keys the application put on hold instead of working on them: they
    /// become `held` (final for this run) in the same transaction.
    pub held: Vec<String>,
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
    ) -> impl Future<Output = Result<Handled, HandlerError>> + Send + 'a;

    /// The same effects in SQL, if the handler can say them so: the engine
    /// then claims, marks and runs them as one statement per chunk (see
    /// [`ChunkSql`]) and never calls [`ChunkHandler::handle_chunk`]. Both
    /// must do the same thing.
    fn chunk_sql(&self) -> Option<ChunkSql> {
        None
    }
}

/// Marks a handled chunk: held keys `held`, the rest `settled`.
async fn mark_handled(
    tx: &mut PgConnection,
    queue: &WorkQueue,
    chunk: &Chunk,
    handled: &Handled,
) -> Result<usize, EngineError> {
    let settled: Vec<String> = chunk
        .items
        .iter()
        .filter(|i| !handled.held.contains(&i.key))
        .map(|i| i.key.clone())
        .collect();
    if !handled.held.is_empty() {
        queue.mark_held_in_tx(tx, &chunk.scope, &handled.held).await?;
    }
    if !settled.is_empty() {
        queue.mark_settled_in_tx(tx, &chunk.scope, &settled).await?;
    }
    Ok(settled.len())
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

/// Drains `scope` of run `run_id` with `cfg.concurrency` claim loops until no
/// eligible or processing item is left (or the run stops running, or
/// `stats.stop` is set).
pub async fn drain_in_transactions<H: ChunkHandler>(
    pool: &PgPool,
    queue: Arc<WorkQueue>,
    run_id: i64,
    scope: &str,
    handler: Arc<H>,
    cfg: &DrainConfig,
    stats: Arc<DrainStats>,
) -> Result<(), EngineError> {
    check_config(cfg)?;
    let mut loops = tokio::task::JoinSet::new();
    let (ranges, statements) = {
        let mut conn = pool
            .acquire()
            .await
            .map_err(EngineError::db("acquiring a connection"))?;
        let ranges = RunRanges::cut(&mut conn, &queue, run_id, scope, cfg.chunk).await?;
        let statements = match handler.chunk_sql() {
            Some(sql) => Some(Arc::new(queue.chunk_statements_for(&mut conn, scope, &sql).await?)),
            None => None,
        };
        (ranges, statements)
    };
    if let Some(statements) = statements {
        for _ in 0..cfg.concurrency {
            let (pool, queue, statements, stats, cfg, scope) = (
                pool.clone(),
                queue.clone(),
                statements.clone(),
                stats.clone(),
                cfg.clone(),
                scope.to_string(),
            );
            loops.spawn(async move {
                let cursor = ClaimCursor::new(ranges);
                let chunk = ChunkTarget {
                    pool: &pool,
                    queue: &queue,
                    statements: &statements,
                    run_id,
                    scope: &scope,
                    cfg: &cfg,
                    stats: &stats,
                };
                run_loop(&stats, &cfg, run_id, &scope, || settle_one_statement(&chunk, &cursor)).await
            });
        }
        return join_loops(loops, &stats).await;
    }
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
            let cursor = ClaimCursor::new(ranges);
            run_loop(&stats, &cfg, run_id, &scope, || {
                settle_one_chunk(&pool, &queue, run_id, &scope, &*handler, &cfg, &stats, &cursor)
            })
            .await
        });
    }
    join_loops(loops, &stats).await
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

/// Repeats `step` until drained or stopped. Transient failures (the database
/// restarting, a terminated connection) are retried without limit, with a
/// capped backoff; fatal ones (a missing grant, [`EngineError::is_fatal`])
/// end the loop at once; others give up after `max_consecutive_failures`.
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
    let mut failures = 0u32;
    let mut transient_streak = 0u32;
    let mut outage_since: Option<std::time::Instant> = None;
    while !stats.stop.load(Ordering::Relaxed) {
        let stepped = step().await;
        if stepped.is_ok() {
            outage_since = None;
        }
        if stepped.is_ok() && transient_streak > 0 {
            // One line when the database is back, not one per attempt.
            tracing::info!(
                run = run_id,
                scope,
                retries = transient_streak,
                "claim loop working again"
            );
        }
        match stepped {
            Ok(Step::Worked) => {
                failures = 0;
                transient_streak = 0;
            }
            Ok(Step::NextRange) => {}
            Ok(Step::Drained) => return Ok(()),
            Ok(Step::Idle) => {
                transient_streak = 0;
                tokio::time::sleep(cfg.idle_poll).await
            }
            Err(err) if err.is_fatal() => {
                // No retry can succeed, and no item is at fault: stop every loop.
                stats.chunks_rolled_back.fetch_add(1, Ordering::Relaxed);
                return Err(err);
            }
            Err(err) => {
                stats.chunks_rolled_back.fetch_add(1, Ordering::Relaxed);
                let transient = err.is_transient();
                if transient {
                    transient_streak += 1;
                    let since = *outage_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > cfg.max_outage {
                        return Err(EngineError::Unavailable {
                            secs: since.elapsed().as_secs(),
                            last: err.to_string(),
                        });
                    }
                } else {
                    failures += 1;
                }
                // A transient streak (a restart, a failover) is said once,
                // at its start; every other failure is said each time.
                if !transient || transient_streak == 1 {
                    tracing::warn!(run = run_id, scope, transient, failures, error = %err, "chunk rolled back");
                }
                if failures >= cfg.max_consecutive_failures {
                    return Err(EngineError::TooManyFailures {
                        attempts: failures,
                        last: err.to_string(),
                    });
                }
                let exponent = (failures + transient_streak).min(10);
                let backoff = (25u64 << exponent).min(MAX_RETRY_BACKOFF_MS);
                tokio::time::sleep(Duration::from_millis(backoff)).await;
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

/// Where a claim loop is in its run's key ranges (see [`crate::ranges`]).
#[derive(Debug)]
struct ClaimCursor {
    ranges: RunRanges,
    at: std::sync::Mutex<At>,
}

#[derive(Debug, Clone)]
enum At {
    /// Between ranges: take the next free one.
    NoRange,
    /// In a range; its `after` is where the next claim goes on.
    Range(KeyRange),
    /// Every range of the run was taken: claim from the start of the scope.
    NoneLeft,
}

/// The keys of a loop's next claim: within its range after its cursor, or,
/// with no range left, the whole scope.
#[derive(Debug, Clone)]
struct Window {
    ranged: bool,
    after: Option<String>,
    upto: Option<String>,
}

impl Window {
    fn keys(&self) -> KeyWindow<'_> {
        KeyWindow {
            after: self.after.as_deref(),
            upto: self.upto.as_deref(),
        }
    }
}

impl ClaimCursor {
    fn new(ranges: RunRanges) -> ClaimCursor {
        ClaimCursor {
            ranges,
            at: std::sync::Mutex::new(At::NoRange),
        }
    }

    /// The window of the next claim: the loop's range from its cursor, a
    /// range newly taken on `conn` (committed at once: call it outside a
    /// transaction), or the whole scope when no range is left.
    async fn window(&self, conn: &mut PgConnection) -> Result<Window, EngineError> {
        let at = self.at.lock().expect("cursor lock").clone();
        let at = match at {
            At::NoRange => {
                let taken = self.ranges.take(conn).await?.map_or(At::NoneLeft, At::Range);
                *self.at.lock().expect("cursor lock") = taken.clone();
                taken
            }
            at => at,
        };
        Ok(match at {
            At::Range(range) => Window {
                ranged: true,
                after: range.after,
                upto: range.upto,
            },
            At::NoRange | At::NoneLeft => Window {
                ranged: false,
                after: None,
                upto: None,
            },
        })
    }

    /// After a claim of `claimed` items ending at `last` in `window`: a
    /// claim that ran short ends the loop's range; otherwise the loop goes
    /// on after `last`.
    fn advance(&self, window: &Window, claimed: usize, limit: u32, last: Option<String>) {
        if !window.ranged {
            return;
        }
        let mut at = self.at.lock().expect("cursor lock");
        match &mut *at {
            At::Range(range) if claimed >= limit as usize => range.after = last,
            _ => *at = At::NoRange,
        }
    }
}

/// After an empty claim: the next range, or (with none left) done, or
/// others hold the rest (or it waits for a retry time).
async fn after_empty_claim(
    conn: &mut PgConnection,
    window: &Window,
    queue: &WorkQueue,
    run_id: i64,
    scope: &str,
) -> Result<Step, EngineError> {
    if window.ranged {
        return Ok(Step::NextRange);
    }
    idle_or_drained(conn, queue, run_id, scope).await
}

/// One transaction: claim (in the loop's window), handle, mark settled, commit.
#[allow(clippy::too_many_arguments)]
async fn settle_one_chunk<H: ChunkHandler>(
    pool: &PgPool,
    queue: &WorkQueue,
    run_id: i64,
    scope: &str,
    handler: &H,
    cfg: &DrainConfig,
    stats: &DrainStats,
    cursor: &ClaimCursor,
) -> Result<Step, EngineError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(EngineError::db("acquiring a connection"))?;
    let window = cursor.window(&mut conn).await?;
    let mut tx = conn.begin().await.map_err(EngineError::db("beginning a transaction"))?;
    let started = Instant::now();
    let claimed = queue
        .claim_chunk_in_tx_window(&mut tx, scope, cfg.chunk, run_id, window.keys())
        .await?;
    stats.record_claim("tx", started.elapsed());
    let last = claimed.iter().map(|i| i.key.clone()).max();
    cursor.advance(&window, claimed.len(), cfg.chunk, last);
    if claimed.is_empty() {
        tx.rollback().await.map_err(EngineError::db("ending an empty claim"))?;
        return after_empty_claim(&mut conn, &window, queue, run_id, scope).await;
    }
    stats.items_claimed.fetch_add(claimed.len() as u64, Ordering::Relaxed);
    let chunk = Chunk::new(run_id, scope, claimed);
    let handling = Instant::now();
    let handled = handler.handle_chunk(&mut tx, &chunk).await;
    metrics::histogram!(crate::telemetry::HANDLER_DURATION, "mode" => "tx").record(handling.elapsed().as_secs_f64());
    match handled {
        Ok(handled) => {
            let settled = mark_handled(&mut tx, queue, &chunk, &handled).await?;
            tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
            stats.chunks_committed.fetch_add(1, Ordering::Relaxed);
            stats.items_settled.fetch_add(settled as u64, Ordering::Relaxed);
            stats.items_held.fetch_add(handled.held.len() as u64, Ordering::Relaxed);
            Ok(Step::Worked)
        }
        Err(err) => {
            let _ = tx.rollback().await;
            drop(conn);
            if err.is_fatal() || !err.is_permanent() {
                // A lost connection says nothing about the items: retry the
                // whole chunk later instead of hunting for a culprit. A
                // missing grant says nothing about them either: stop.
                return Err(EngineError::Handler {
                    items: chunk.items.len(),
                    first_key: chunk.items[0].key.clone(),
                    source: err,
                });
            }
            isolate_failure(pool, queue, handler, cfg, stats, chunk, err).await?;
            Ok(Step::Worked)
        }
    }
}

/// What a claim loop of the one-statement path works on.
struct ChunkTarget<'a> {
    pool: &'a PgPool,
    queue: &'a WorkQueue,
    statements: &'a ChunkStatements,
    run_id: i64,
    scope: &'a str,
    cfg: &'a DrainConfig,
    stats: &'a DrainStats,
}

impl ChunkTarget<'_> {
    /// Counts a committed chunk.
    fn committed(&self, done: &ChunkDone) {
        self.stats.chunks_committed.fetch_add(1, Ordering::Relaxed);
        self.stats.items_settled.fetch_add(done.settled, Ordering::Relaxed);
        self.stats
            .items_held
            .fetch_add(done.held.len() as u64, Ordering::Relaxed);
    }
}

/// One transaction of the one-statement path: claim in the loop's window
/// (see [`ClaimCursor`]), mark and pay in one statement, commit.
async fn settle_one_statement(t: &ChunkTarget<'_>, cursor: &ClaimCursor) -> Result<Step, EngineError> {
    let mut conn = t
        .pool
        .acquire()
        .await
        .map_err(EngineError::db("acquiring a connection"))?;
    let window = cursor.window(&mut conn).await?;
    let mut tx = t.statements.begin(&mut conn).await?;
    let started = Instant::now();
    let ran = t
        .statements
        .run(&mut tx, t.scope, t.cfg.chunk, t.run_id, window.keys())
        .await?;
    t.stats.record_claim("tx", started.elapsed());
    let done = match ran {
        Ok(done) => done,
        Err(err) => {
            let _ = tx.rollback().await;
            drop(conn);
            return statement_failed(t, &window, err).await;
        }
    };
    cursor.advance(&window, done.claimed as usize, t.cfg.chunk, done.last_key.clone());
    if done.claimed == 0 {
        // Decided outside the chunk's transaction, which runs only chunk statements.
        tx.rollback().await.map_err(EngineError::db("ending an empty claim"))?;
        return after_empty_claim(&mut conn, &window, t.queue, t.run_id, t.scope).await;
    }
    t.stats.items_claimed.fetch_add(done.claimed, Ordering::Relaxed);
    tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
    t.committed(&done);
    Ok(Step::Worked)
}

/// A chunk statement failed (and was rolled back). A transient failure is
/// retried by the loop; a permanent one is narrowed down: the same claim is
/// made again without effects to learn its keys, then the keys are settled
/// in halves until the failing item is alone.
async fn statement_failed(t: &ChunkTarget<'_>, window: &Window, err: HandlerError) -> Result<Step, EngineError> {
    let first_key = window
        .after
        .as_ref()
        .map_or_else(|| "(from the start)".to_string(), |a| format!("after {a}"));
    if err.is_fatal() || !err.is_permanent() {
        return Err(EngineError::Handler {
            items: t.cfg.chunk as usize,
            first_key,
            source: err,
        });
    }
    let mut tx = t
        .pool
        .begin()
        .await
        .map_err(EngineError::db("beginning a transaction"))?;
    let claimed = t
        .queue
        .claim_chunk_in_tx_window(&mut tx, t.scope, t.cfg.chunk, t.run_id, window.keys())
        .await?;
    tx.rollback().await.map_err(EngineError::db("ending a claim"))?;
    let keys: Vec<String> = claimed.into_iter().map(|i| i.key).collect();
    if keys.is_empty() {
        // Others took the rows meanwhile; nothing to narrow down here.
        return Ok(Step::Worked);
    }
    tracing::warn!(run = t.run_id, scope = t.scope, items = keys.len(), error = %err, "chunk failed; retrying it in halves");
    isolate_statement_failure(t, keys, err).await?;
    Ok(Step::Worked)
}

/// [`isolate_failure`] for the one-statement path.
async fn isolate_statement_failure(
    t: &ChunkTarget<'_>,
    keys: Vec<String>,
    err: HandlerError,
) -> Result<(), EngineError> {
    let mut pending = vec![(keys, err)];
    while let Some((keys, err)) = pending.pop() {
        if keys.len() == 1 {
            let failed = fail_alone(t.pool, t.queue, t.cfg, t.stats, t.scope, &keys[0], &err).await?;
            tracing::warn!(run = t.run_id, scope = t.scope, item = %keys[0], failed, error = %err, "item failed");
            continue;
        }
        t.stats.chunks_split.fetch_add(1, Ordering::Relaxed);
        let mid = keys.len() / 2;
        for half in [keys[..mid].to_vec(), keys[mid..].to_vec()] {
            let mut conn = t
                .pool
                .acquire()
                .await
                .map_err(EngineError::db("acquiring a connection"))?;
            let mut tx = t.statements.begin(&mut conn).await?;
            match t.statements.run_keys(&mut tx, t.scope, t.run_id, &half).await? {
                Ok(done) => {
                    tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
                    t.committed(&done);
                }
                Err(half_err) => {
                    let _ = tx.rollback().await;
                    if half_err.is_fatal() || !half_err.is_permanent() {
                        return Err(EngineError::Handler {
                            items: half.len(),
                            first_key: half[0].clone(),
                            source: half_err,
                        });
                    }
                    pending.push((half, half_err));
                }
            }
        }
    }
    Ok(())
}

/// Records the failure of an item found failing alone (retried later, or
/// failed for good once its attempts are spent); true when it failed for good.
async fn fail_alone(
    pool: &PgPool,
    queue: &WorkQueue,
    cfg: &DrainConfig,
    stats: &DrainStats,
    scope: &str,
    key: &str,
    err: &HandlerError,
) -> Result<bool, EngineError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(EngineError::db("acquiring a connection"))?;
    let outcome = queue
        .fail_unclaimed(
            &mut conn,
            scope,
            &[key.to_string()],
            Failure {
                error: &err.to_string(),
                permanent: err.is_permanent(),
            },
            &cfg.retry,
        )
        .await?;
    stats.items_failed.fetch_add(outcome.failed, Ordering::Relaxed);
    stats.items_retried.fetch_add(outcome.retried, Ordering::Relaxed);
    Ok(outcome.failed == 1)
}

/// Retries a failed chunk in halves, each in its own transaction, until the
/// failing item is alone; it alone records the failure.
async fn isolate_failure<H: ChunkHandler>(
    pool: &PgPool,
    queue: &WorkQueue,
    handler: &H,
    cfg: &DrainConfig,
    stats: &DrainStats,
    chunk: Chunk,
    err: HandlerError,
) -> Result<(), EngineError> {
    // Depth-first over halves; bounded by 2 * chunk size transactions.
    let mut pending = vec![(chunk, err)];
    while let Some((chunk, err)) = pending.pop() {
        if chunk.items.len() == 1 {
            let item = &chunk.items[0];
            let failed = fail_alone(pool, queue, cfg, stats, &chunk.scope, &item.key, &err).await?;
            tracing::warn!(
                run = chunk.run_id, scope = %chunk.scope, item = %item.key, attempt = item.fence.get(),
                failed, error = %err, "item failed"
            );
            continue;
        }
        stats.chunks_split.fetch_add(1, Ordering::Relaxed);
        let mid = chunk.items.len() / 2;
        for half in [chunk.items[..mid].to_vec(), chunk.items[mid..].to_vec()] {
            let keys: Vec<String> = half.iter().map(|i| i.key.clone()).collect();
            let mut tx = pool.begin().await.map_err(EngineError::db("beginning a transaction"))?;
            let locked = queue.lock_keys_in_tx(&mut tx, &chunk.scope, &keys).await?;
            if locked.is_empty() {
                tx.rollback().await.map_err(EngineError::db("ending an empty retry"))?;
                continue;
            }
            let part = Chunk::new(chunk.run_id, &chunk.scope, locked);
            match handler.handle_chunk(&mut tx, &part).await {
                Ok(handled) => {
                    let settled = mark_handled(&mut tx, queue, &part, &handled).await?;
                    tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
                    stats.chunks_committed.fetch_add(1, Ordering::Relaxed);
                    stats.items_settled.fetch_add(settled as u64, Ordering::Relaxed);
                    stats.items_held.fetch_add(handled.held.len() as u64, Ordering::Relaxed);
                }
                Err(half_err) => {
                    let _ = tx.rollback().await;
                    if half_err.is_fatal() || !half_err.is_permanent() {
                        return Err(EngineError::Handler {
                            items: part.items.len(),
                            first_key: part.items[0].key.clone(),
                            source: half_err,
                        });
                    }
                    pending.push((part, half_err));
                }
            }
        }
    }
    Ok(())
}
