//! Leased mode: for work outside the database (a payment provider, slow work).
//!
//! A short transaction claims a chunk and commits its leases; the work runs
//! outside any transaction; one transaction then writes the effects of the
//! items whose fence still holds, together with their `settled` status. The
//! [`LeaseKeeper`] renews every lease this worker holds in one statement every
//! ttl/3, and an item whose lease could not be renewed in time is abandoned:
//! no more work is started on it. Whatever a paused worker does afterwards,
//! its completion carries an old fence and is refused.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::batch::drain::{check_config, idle_or_drained, run_loop, Step};
use crate::batch::drainer::RunTarget;
use crate::batch::queue::WorkQueue;
use crate::batch::stats::{DrainConfig, DrainStats};
use crate::common::error::{EngineError, HandlerError};
use crate::common::item::{Chunk, ClaimedItem};
use crate::common::lease::{check_lease_config, LeaseConfig, LeaseKeeper, LeaseStore, COMPLETION_RETRIES};
use crate::common::loops::run_loops;
use crate::common::retry::Failure;

/// The application's work in leased mode.
pub trait LeasedHandler: Send + Sync + 'static {
    /// What `prepare` loads for a chunk (amounts, addresses...).
    type Batch: Send + Sync;

    /// Loads what the chunk's work needs, with set-based statements.
    fn prepare<'a>(
        &'a self,
        pool: &'a PgPool,
        chunk: &'a Chunk,
    ) -> impl Future<Output = Result<Self::Batch, HandlerError>> + Send + 'a;

    /// Keys of the chunk not to work on now (on hold): marked `held`.
    fn held(&self, batch: &Self::Batch) -> Vec<String>;

    /// Does one item's work outside any transaction. It must be idempotent
    /// per item (an item may be worked on again after a crash or a lost
    /// lease): send an idempotency key derived from the item.
    fn work_item<'a>(
        &'a self,
        batch: &'a Self::Batch,
        chunk: &'a Chunk,
        item: &'a ClaimedItem,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;

    /// Writes the effects of `chunk`'s items (all accepted by the fence) in
    /// the completion transaction, with set-based statements; never commits.
    fn commit<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        chunk: &'a Chunk,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;
}

/// Drains the run's scope in leased mode with `cfg.concurrency` claim
/// loops. Runs the lease keeper and the rescuer alongside.
pub async fn drain_leased<H: LeasedHandler>(
    run: RunTarget<'_>,
    handler: Arc<H>,
    leases: LeaseConfig,
) -> Result<(), EngineError> {
    let RunTarget {
        pool,
        run_id,
        scope,
        worker,
        cfg,
        ..
    } = run;
    let (queue, stats) = (run.queue.clone(), run.stats.clone());
    check_config(cfg)?;
    check_lease_config(&leases)?;
    let calls = Arc::new(tokio::sync::Semaphore::new(leases.calls_in_flight));
    let keeper = LeaseKeeper::on_clock(worker, leases.ttl, stats.outage.clone(), cfg.max_outage);
    let store = ScopeLeases {
        queue: queue.clone(),
        scope: scope.to_string(),
    };
    let renewing = tokio::spawn(keeper.clone().keep_renewing(pool.clone(), store));
    let rescuing = tokio::spawn(crate::batch::rescuer::keep_rescuing(
        pool.clone(),
        queue.clone(),
        scope.to_string(),
        cfg.retry,
        leases.rescue_interval,
        stats.clone(),
    ));
    let hard_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let grace = tokio::spawn(hard_stop_after_grace(
        stats.clone(),
        hard_stop.clone(),
        leases.shutdown_grace,
    ));

    let spawn_one = || {
        let ctx = LoopCtx {
            pool: pool.clone(),
            queue: queue.clone(),
            run_id,
            scope: scope.to_string(),
            worker,
            handler: handler.clone(),
            cfg: cfg.clone(),
            ttl: leases.ttl,
            stats: stats.clone(),
            keeper: keeper.clone(),
            hard_stop: hard_stop.clone(),
            calls: calls.clone(),
        };
        async move { run_loop(&ctx.stats, &ctx.cfg, ctx.run_id, &ctx.scope, || ctx.lease_one_chunk()).await }
    };
    let stop = || stats.stop.store(true, Ordering::Relaxed);
    let result = run_loops(cfg.concurrency, "claim loop", spawn_one, stop).await;
    grace.abort();
    rescuing.abort();
    // Anything still tracked was abandoned at shutdown: give it back now,
    // with no renewal in flight (it could hold the same rows). Not once the
    // outage outlasted its limit: the leases expire by themselves.
    let no_renewal = tokio::select! {
        guard = keeper.renewing.lock() => Some(guard),
        _ = stats.outage.until_outlasted(cfg.max_outage) => None,
    };
    if no_renewal.is_some() {
        if let Ok(mut conn) = stats.outage.acquire(pool, cfg.max_outage).await {
            if let Ok(released) = queue.release_leases(&mut conn, scope, worker, None).await {
                stats.leases_released.fetch_add(released, Ordering::Relaxed);
            }
        }
    }
    renewing.abort();
    drop(no_renewal);
    result
}

/// One scope of a batch queue.
pub(crate) struct ScopeLeases {
    pub(crate) queue: Arc<WorkQueue>,
    pub(crate) scope: String,
}

impl LeaseStore for ScopeLeases {
    fn renew<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        worker: Uuid,
        ttl: Duration,
        held: &'a [ClaimedItem],
    ) -> impl Future<Output = Result<Vec<ClaimedItem>, EngineError>> + Send + 'a {
        self.queue.renew_leases(conn, &self.scope, worker, ttl, held)
    }
}

/// Once a stop is requested, allows in-flight work `grace` to finish.
async fn hard_stop_after_grace(stats: Arc<DrainStats>, hard_stop: Arc<std::sync::atomic::AtomicBool>, grace: Duration) {
    while !stats.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(grace).await;
    hard_stop.store(true, Ordering::Relaxed);
}

struct LoopCtx<H> {
    pool: PgPool,
    queue: Arc<WorkQueue>,
    run_id: i64,
    scope: String,
    worker: Uuid,
    handler: Arc<H>,
    cfg: DrainConfig,
    ttl: Duration,
    stats: Arc<DrainStats>,
    keeper: Arc<LeaseKeeper>,
    hard_stop: Arc<std::sync::atomic::AtomicBool>,
    /// Slots for items being worked, shared by the process's loops.
    calls: Arc<tokio::sync::Semaphore>,
}

impl<H: LeasedHandler> LoopCtx<H> {
    /// A pooled connection, waited for no longer than the outage limit allows.
    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, EngineError> {
        self.stats.outage.acquire(&self.pool, self.cfg.max_outage).await
    }

    async fn lease_one_chunk(&self) -> Result<Step, EngineError> {
        let mut conn = self.conn().await?;
        let sent = Instant::now();
        let claimed = self
            .queue
            .claim_leased(
                &mut conn,
                &self.scope,
                self.cfg.chunk,
                self.run_id,
                self.worker,
                self.ttl,
            )
            .await?;
        self.stats.record_claim("leased", sent.elapsed());
        if claimed.is_empty() {
            return idle_or_drained(&mut conn, &self.queue, self.run_id, &self.scope).await;
        }
        drop(conn);
        self.stats
            .items_claimed
            .fetch_add(claimed.len() as u64, Ordering::Relaxed);
        let chunk = Chunk::new(self.run_id, &self.scope, claimed);
        self.keeper.add(&chunk.items, sent, Instant::now());
        let result = self.work_and_complete(&chunk).await;
        self.keeper.remove(&chunk.items);
        result.map(|()| Step::Worked)
    }

    async fn work_and_complete(&self, chunk: &Chunk) -> Result<(), EngineError> {
        // The application's statements wait for the pool's connections
        // (its own timeout): not past the outage limit.
        let prepared = tokio::select! {
            prepared = self.handler.prepare(&self.pool, chunk) => prepared,
            _ = self.stats.outage.until_outlasted(self.cfg.max_outage) => {
                Err(HandlerError::Database(sqlx::Error::PoolTimedOut))
            }
        };
        let batch = match prepared {
            Ok(batch) => batch,
            Err(err) => {
                let all: Vec<&ClaimedItem> = chunk.items.iter().collect();
                return self.record_failure(chunk, &all, err).await;
            }
        };
        let held = self.handler.held(&batch);
        if !held.is_empty() {
            let pairs: Vec<ClaimedItem> = chunk.items.iter().filter(|i| held.contains(&i.key)).cloned().collect();
            let _writing = self.keeper.writing(&pairs).await;
            let mut conn = self.conn().await?;
            let marked = self.queue.hold_fenced(&mut conn, &chunk.scope, &pairs).await?;
            self.stats.items_held.fetch_add(marked, Ordering::Relaxed);
        }
        let mut done = Vec::new();
        let mut failed: Vec<(ClaimedItem, HandlerError)> = Vec::new();
        let mut abandoned = Vec::new();
        // The chunk's items are worked concurrently, as many at once as the
        // process has slots. Each is checked once its slot is granted: an
        // item whose lease lapsed while it waited, or after a stop, is not
        // worked. The completion waits for every call, each bounded by the
        // handler's own timeout (the provider's).
        let batch = &batch;
        let to_work: Vec<&ClaimedItem> = chunk.items.iter().filter(|i| !held.contains(&i.key)).collect();
        let work = to_work.iter().map(|&item| async move {
            let _slot = self.calls.acquire().await.ok()?;
            if self.hard_stop.load(Ordering::Relaxed) || !self.keeper.is_held(item) {
                return None;
            }
            let working = Instant::now();
            let worked = self.handler.work_item(batch, chunk, item).await;
            metrics::histogram!(crate::common::telemetry::HANDLER_DURATION, "mode" => "leased")
                .record(working.elapsed().as_secs_f64());
            Some(worked)
        });
        let outcomes = futures_util::future::join_all(work).await;
        for (item, outcome) in to_work.into_iter().zip(outcomes) {
            match outcome {
                None => abandoned.push(item.clone()),
                Some(Ok(())) => done.push(item.clone()),
                Some(Err(err)) => failed.push((item.clone(), err)),
            }
        }
        if !done.is_empty() {
            self.complete(&chunk.with_items(done)).await?;
        }
        for (item, err) in failed {
            self.record_failure(chunk, &[&item], err).await?;
        }
        if !abandoned.is_empty() {
            let still_ours: Vec<String> = abandoned
                .iter()
                .filter(|i| self.keeper.is_held(i))
                .map(|i| i.key.clone())
                .collect();
            if !still_ours.is_empty() {
                // Stopping: give back what we still hold, so others take it at once.
                let _writing = self.keeper.writing(&abandoned).await;
                let mut conn = self.conn().await?;
                let released = self
                    .queue
                    .release_leases(&mut conn, &self.scope, self.worker, Some(&still_ours))
                    .await?;
                self.stats.leases_released.fetch_add(released, Ordering::Relaxed);
            }
            tracing::warn!(
                run = self.run_id, scope = %self.scope, abandoned = abandoned.len(),
                "items abandoned: lease lost or shutting down"
            );
        }
        Ok(())
    }

    /// The fenced completion of items whose work is done, retried a few
    /// times on transient errors. A commit the handler refuses is split in
    /// halves until the refused item is alone.
    async fn complete(&self, done: &Chunk) -> Result<(), EngineError> {
        let mut pending = vec![done.clone()];
        while let Some(part) = pending.pop() {
            let mut attempt = 0;
            loop {
                match self.complete_once(&part).await {
                    Ok(()) => break,
                    Err(CompleteError::Engine(err))
                        if err.is_transient()
                            && attempt < COMPLETION_RETRIES
                            && !self.stats.outage.outlasted(self.cfg.max_outage) =>
                    {
                        attempt += 1;
                        tracing::warn!(run = self.run_id, error = %err, attempt, "completion failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    }
                    Err(CompleteError::Engine(err)) => return Err(err),
                    Err(CompleteError::Handler(err))
                        if part.items.len() > 1 && err.is_permanent() && !err.is_fatal() =>
                    {
                        self.stats.chunks_split.fetch_add(1, Ordering::Relaxed);
                        let mid = part.items.len() / 2;
                        pending.push(part.with_items(part.items[mid..].to_vec()));
                        pending.push(part.with_items(part.items[..mid].to_vec()));
                        break;
                    }
                    Err(CompleteError::Handler(err)) => {
                        let items: Vec<&ClaimedItem> = part.items.iter().collect();
                        self.record_failure(&part, &items, err).await?;
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    async fn complete_once(&self, part: &Chunk) -> Result<(), CompleteError> {
        let _writing = self.keeper.writing(&part.items).await;
        let mut conn = self.conn().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(EngineError::db("beginning a transaction"))?;
        let accepted = self.queue.complete_fenced(&mut tx, &part.scope, &part.items).await?;
        let accepted: std::collections::HashSet<String> = accepted.into_iter().collect();
        let (kept, rejected): (Vec<ClaimedItem>, Vec<ClaimedItem>) =
            part.items.iter().cloned().partition(|i| accepted.contains(&i.key));
        if !kept.is_empty() {
            if let Err(err) = self.handler.commit(&mut tx, &part.with_items(kept.clone())).await {
                let _ = tx.rollback().await;
                return Err(CompleteError::Handler(err));
            }
        }
        tx.commit().await.map_err(EngineError::db("committing a completion"))?;
        self.stats.items_settled.fetch_add(kept.len() as u64, Ordering::Relaxed);
        self.stats.chunks_committed.fetch_add(1, Ordering::Relaxed);
        if !rejected.is_empty() {
            self.stats
                .fence_rejections
                .fetch_add(rejected.len() as u64, Ordering::Relaxed);
            for item in &rejected {
                tracing::warn!(
                    run = self.run_id, scope = %part.scope, item = %item.key, attempt = item.fence.get(),
                    "completion refused by the fence: the lease was lost, another attempt owns the item"
                );
            }
        }
        Ok(())
    }

    /// Records a failed attempt of `items`; a fatal error (a missing grant,
    /// [`HandlerError::is_fatal`]) is not theirs: it ends the loop instead,
    /// and the drain gives their leases back.
    async fn record_failure(
        &self,
        chunk: &Chunk,
        items: &[&ClaimedItem],
        err: HandlerError,
    ) -> Result<(), EngineError> {
        if err.is_fatal() {
            return Err(EngineError::Handler {
                items: items.len(),
                first_key: items.first().map_or_else(String::new, |i| i.key.clone()),
                source: err,
            });
        }
        let err = &err;
        let pairs: Vec<ClaimedItem> = items.iter().map(|i| (*i).clone()).collect();
        let _writing = self.keeper.writing(&pairs).await;
        let mut conn = self.conn().await?;
        let outcome = self
            .queue
            .fail_fenced(
                &mut conn,
                &chunk.scope,
                &pairs,
                Failure {
                    error: &err.to_string(),
                    permanent: err.is_permanent(),
                },
                &self.cfg.retry,
            )
            .await?;
        self.stats.items_failed.fetch_add(outcome.failed, Ordering::Relaxed);
        self.stats.items_retried.fetch_add(outcome.retried, Ordering::Relaxed);
        for item in items {
            tracing::warn!(
                run = self.run_id, scope = %chunk.scope, item = %item.key, attempt = item.fence.get(),
                permanent = err.is_permanent(), error = %err, "item attempt failed"
            );
        }
        Ok(())
    }
}

enum CompleteError {
    Engine(EngineError),
    Handler(HandlerError),
}

impl From<EngineError> for CompleteError {
    fn from(err: EngineError) -> Self {
        CompleteError::Engine(err)
    }
}
