//! Leased mode: a short transaction claims a batch and commits its leases;
//! the work runs outside any transaction while the lease keeper renews
//! them; one transaction then settles the jobs whose fence still holds,
//! with the handler's effects. A job whose lease could not be renewed in
//! time is not started; a paused worker's completion carries an old fence
//! and is refused. A stop lets work in hand run for the grace period, then
//! gives back what is left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::super::finish::Held;
use super::super::ClaimedJob;
use super::spans::{self, JobSpans};
use super::{failure, guarded, Ctx, LeasedJobHandler, Step};
use crate::common::error::{EngineError, HandlerError};
use crate::common::item::ClaimedItem;
use crate::common::lease::{LeaseKeeper, COMPLETION_RETRIES};

/// What the loops of one leased serve share besides [`Ctx`].
struct Leased<H> {
    ctx: Ctx,
    handler: Arc<H>,
    keeper: Arc<LeaseKeeper>,
    /// Set once the grace after a stop has passed: start no more work.
    hard_stop: Arc<AtomicBool>,
    /// Slots for jobs being worked, shared by the process's loops.
    calls: Arc<tokio::sync::Semaphore>,
}

/// What became of a batch's jobs.
struct Outcomes<T> {
    done: Vec<(ClaimedJob, T)>,
    failed: Vec<(ClaimedJob, HandlerError)>,
    abandoned: Vec<ClaimedJob>,
}

pub(super) async fn serve<H: LeasedJobHandler>(ctx: Ctx, handler: Arc<H>) -> Result<(), EngineError> {
    let keeper = LeaseKeeper::new(ctx.cfg.worker, ctx.cfg.lease.ttl);
    let renewing = tokio::spawn(keeper.clone().keep_renewing(ctx.pool.clone(), (*ctx.queue).clone()));
    let hard_stop = Arc::new(AtomicBool::new(false));
    let grace = tokio::spawn(hard_stop_after_grace(ctx.clone(), hard_stop.clone()));
    let shared = Arc::new(Leased {
        ctx: ctx.clone(),
        handler,
        keeper: keeper.clone(),
        hard_stop,
        calls: Arc::new(tokio::sync::Semaphore::new(ctx.cfg.lease.calls_in_flight)),
    });
    let result = ctx
        .run_loops(|| {
            let shared = shared.clone();
            async move { shared.ctx.run(|| shared.step()).await }
        })
        .await;
    grace.abort();
    // What is still held was abandoned at the stop: give it back now, with
    // no renewal in flight (it could hold the same rows).
    let no_renewal = keeper.renewing.lock().await;
    if let Ok(mut conn) = ctx.conn().await {
        if let Ok(n) = ctx.queue.release_leases(&mut conn, ctx.cfg.worker, None).await {
            ctx.stats.count(&ctx.queue, "released", &ctx.stats.released, n);
        }
    }
    renewing.abort();
    drop(no_renewal);
    result
}

/// Once a stop is requested, allows work in hand the grace to finish.
async fn hard_stop_after_grace(ctx: Ctx, hard_stop: Arc<AtomicBool>) {
    while !ctx.stats.stopped() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(ctx.cfg.lease.shutdown_grace).await;
    hard_stop.store(true, Ordering::Relaxed);
}

fn items(jobs: &[ClaimedJob]) -> Vec<ClaimedItem> {
    jobs.iter()
        .map(|j| ClaimedItem {
            key: j.key.clone(),
            fence: j.fence,
        })
        .collect()
}

impl<H: LeasedJobHandler> Leased<H> {
    async fn step(&self) -> Result<Step, EngineError> {
        let ctx = &self.ctx;
        let mut conn = ctx.conn().await?;
        let sent = Instant::now();
        let claim = spans::claim(&ctx.queue, "leased", ctx.cfg.batch);
        let claimed = ctx
            .queue
            .claim_leased(&mut conn, ctx.cfg.batch, ctx.cfg.worker, ctx.cfg.lease.ttl)
            .instrument(claim.clone())
            .await?;
        ctx.claimed("leased", sent.elapsed(), &claimed);
        drop(conn);
        if claimed.is_empty() {
            return Ok(Step::Idle);
        }
        let spans = JobSpans::open(&ctx.queue, &claim, &claimed);
        drop(claim);
        let jobs: Vec<ClaimedJob> = claimed.into_iter().map(|(job, _)| job).collect();
        let held = items(&jobs);
        self.keeper.add(&held, sent, Instant::now());
        let result = self.work_and_finish(jobs, &spans).await;
        self.keeper.remove(&held);
        result.map(|()| Step::Worked)
    }

    async fn work_and_finish(&self, jobs: Vec<ClaimedJob>, spans: &JobSpans) -> Result<(), EngineError> {
        let outcomes = self.work(jobs, spans).await;
        if !outcomes.done.is_empty() {
            self.complete(outcomes.done, spans).await?;
        }
        for (job, err) in outcomes.failed {
            self.record_failure(&job, err, spans).await?;
        }
        if !outcomes.abandoned.is_empty() {
            self.give_back(&outcomes.abandoned, spans).await?;
        }
        Ok(())
    }

    /// Works the jobs concurrently, as many at once as the process has
    /// slots; a job whose lease lapsed while it waited, or after the
    /// grace, is not started.
    async fn work(&self, jobs: Vec<ClaimedJob>, spans: &JobSpans) -> Outcomes<H::Output> {
        let work = jobs.iter().map(|job| async move {
            let _slot = self.calls.acquire().await.ok()?;
            let item = ClaimedItem {
                key: job.key.clone(),
                fence: job.fence,
            };
            if self.hard_stop.load(Ordering::Relaxed) || !self.keeper.is_held(&item) {
                return None;
            }
            Some(
                guarded(job, self.handler.work(job))
                    .instrument(spans.handler(job))
                    .await,
            )
        });
        let results = futures_util::future::join_all(work).await;
        let mut outcomes = Outcomes {
            done: Vec::new(),
            failed: Vec::new(),
            abandoned: Vec::new(),
        };
        for (job, result) in jobs.into_iter().zip(results) {
            match result {
                None => outcomes.abandoned.push(job),
                Some(Ok(output)) => outcomes.done.push((job, output)),
                Some(Err(err)) => outcomes.failed.push((job, err)),
            }
        }
        outcomes
    }

    /// The fenced completion, retried a few times on transient errors.
    async fn complete(&self, done: Vec<(ClaimedJob, H::Output)>, spans: &JobSpans) -> Result<(), EngineError> {
        let mut attempt = 0;
        loop {
            let completing = spans.completing(done.iter().map(|(job, _)| job));
            let completed = self.complete_once(&done, spans).await;
            drop(completing);
            match completed {
                Ok(()) => return Ok(()),
                Err(err) if err.is_transient() && attempt < COMPLETION_RETRIES => {
                    attempt += 1;
                    tracing::warn!(queue = self.ctx.queue.name(), error = %err, attempt, "completion failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(EngineError::Handler { source, .. }) if source.is_permanent() && !source.is_fatal() => {
                    // The handler refused the batch's effects: each job's
                    // attempt fails (fenced), and is retried or dead.
                    let error = source.to_string();
                    for (job, _) in &done {
                        self.record_failure(job, HandlerError::Permanent(error.clone()), spans)
                            .await?;
                    }
                    return Ok(());
                }
                Err(err) => return Err(err),
            }
        }
    }

    async fn complete_once(&self, done: &[(ClaimedJob, H::Output)], spans: &JobSpans) -> Result<(), EngineError> {
        let ctx = &self.ctx;
        let jobs: Vec<ClaimedJob> = done.iter().map(|(job, _)| job.clone()).collect();
        let _writing = self.keeper.writing(&items(&jobs)).await;
        let mut tx = ctx
            .pool
            .begin()
            .await
            .map_err(EngineError::db("beginning a completion"))?;
        let accepted: std::collections::HashSet<String> =
            ctx.queue.complete_fenced(&mut tx, &jobs).await?.into_iter().collect();
        let kept: Vec<(ClaimedJob, H::Output)> = done
            .iter()
            .filter(|(job, _)| accepted.contains(&job.key))
            .cloned()
            .collect();
        if !kept.is_empty() {
            if let Err(source) = self.handler.complete(&mut tx, &kept).await {
                let _ = tx.rollback().await;
                return Err(EngineError::Handler {
                    items: kept.len(),
                    first_key: kept[0].0.key.clone(),
                    source,
                });
            }
        }
        tx.commit().await.map_err(EngineError::db("committing a completion"))?;
        ctx.stats
            .count(&ctx.queue, "settled", &ctx.stats.settled, kept.len() as u64);
        let rejected = done.len() - kept.len();
        ctx.stats.count(
            &ctx.queue,
            "fence_rejected",
            &ctx.stats.fence_rejections,
            rejected as u64,
        );
        for (job, _) in &kept {
            spans.outcome(&job.key, "settled");
        }
        for (job, _) in done.iter().filter(|(job, _)| !accepted.contains(&job.key)) {
            spans.outcome(&job.key, "fence_rejected");
            tracing::warn!(
                queue = ctx.queue.name(), job = %job.key, fence = %job.fence,
                "completion refused by the fence: the lease was lost, another attempt owns the job"
            );
        }
        Ok(())
    }

    /// A failed attempt: snoozed (no attempt spent), retried later, or dead.
    async fn record_failure(&self, job: &ClaimedJob, err: HandlerError, spans: &JobSpans) -> Result<(), EngineError> {
        let err = failure::unless_fatal(job, err)?;
        let _writing = self.keeper.writing(&items(std::slice::from_ref(job))).await;
        let mut conn = self.ctx.conn().await?;
        failure::record(&self.ctx, &mut conn, Held::Fenced, job, &err, spans).await
    }

    /// Gives back the jobs not started that this worker still holds, so
    /// others take them at once.
    async fn give_back(&self, abandoned: &[ClaimedJob], spans: &JobSpans) -> Result<(), EngineError> {
        let ctx = &self.ctx;
        let held = items(abandoned);
        let still_ours: Vec<String> = held
            .iter()
            .filter(|i| self.keeper.is_held(i))
            .map(|i| i.key.clone())
            .collect();
        for key in &still_ours {
            spans.outcome(key, "released");
        }
        if !still_ours.is_empty() {
            let _writing = self.keeper.writing(&held).await;
            let mut conn = ctx.conn().await?;
            let n = ctx
                .queue
                .release_leases(&mut conn, ctx.cfg.worker, Some(&still_ours))
                .await?;
            ctx.stats.count(&ctx.queue, "released", &ctx.stats.released, n);
        }
        tracing::info!(
            queue = ctx.queue.name(),
            abandoned = abandoned.len(),
            "jobs not started: lease lost or stopping"
        );
        Ok(())
    }
}
