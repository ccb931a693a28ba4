//! In-transaction mode: a claim's row locks hold its jobs; the handler's
//! effects and the jobs' completion commit together. A crash anywhere
//! before the commit rolls everything back and frees the jobs at once.
//! When a job of a batch fails, the batch rolls back and each of its jobs
//! runs again alone, so only a failing job records a failed attempt.

use std::time::Instant;

use sqlx::Connection;
use tracing::Instrument;

use super::super::finish::Held;
use super::super::ClaimedJob;
use super::spans::{self, JobSpans};
use super::{failure, guarded, Ctx, JobHandler, Step};
use crate::common::error::{is_transient_sqlx, EngineError, HandlerError};

/// One transaction: claim a batch, handle each job, complete them, commit.
pub(super) async fn step<H: JobHandler>(ctx: &Ctx, handler: &H) -> Result<Step, EngineError> {
    let mut conn = ctx.conn().await?;
    let mut tx = conn.begin().await.map_err(EngineError::db("beginning a transaction"))?;
    let started = Instant::now();
    let claim = spans::claim(&ctx.queue, "tx", ctx.cfg.batch);
    let claimed = ctx
        .queue
        .claim_in_tx(&mut tx, ctx.cfg.batch)
        .instrument(claim.clone())
        .await?;
    ctx.claimed("tx", started.elapsed(), &claimed);
    if claimed.is_empty() {
        tx.rollback().await.map_err(EngineError::db("ending an empty claim"))?;
        return Ok(Step::Idle);
    }
    let spans = JobSpans::open(&ctx.queue, &claim, &claimed);
    drop(claim);
    let jobs: Vec<ClaimedJob> = claimed.into_iter().map(|(job, _)| job).collect();
    for job in &jobs {
        let handled = guarded(job, handler.handle(&mut tx, job))
            .instrument(spans.handler(job))
            .await;
        if let Err(err) = handled {
            let lost = is_lost_connection(&err) || err.is_fatal();
            let _ = tx.rollback().await;
            if lost {
                // Says nothing about the jobs: the loop retries them later,
                // or stops for good when a grant or a migration is missing.
                return Err(EngineError::Handler {
                    items: jobs.len(),
                    first_key: job.key.clone(),
                    source: err,
                });
            }
            drop(conn);
            if jobs.len() == 1 {
                record_failure(ctx, job, err, &spans).await?;
            } else {
                for job in &jobs {
                    alone(ctx, handler, job, &spans).await?;
                }
            }
            return Ok(Step::Worked);
        }
    }
    let completing = spans.completing(jobs.iter());
    ctx.queue.complete_in_tx(&mut tx, &jobs).await?;
    tx.commit().await.map_err(EngineError::db("committing jobs"))?;
    drop(completing);
    ctx.stats
        .count(&ctx.queue, "settled", &ctx.stats.settled, jobs.len() as u64);
    for job in &jobs {
        spans.outcome(&job.key, "settled");
    }
    Ok(Step::Worked)
}

/// Runs one job of a failed batch in a transaction of its own (if it is
/// still eligible and free), recording its failure if it fails alone.
async fn alone<H: JobHandler>(ctx: &Ctx, handler: &H, job: &ClaimedJob, spans: &JobSpans) -> Result<(), EngineError> {
    let mut conn = ctx.conn().await?;
    let mut tx = conn.begin().await.map_err(EngineError::db("beginning a transaction"))?;
    let Some(job) = ctx
        .queue
        .lock_keys_in_tx(&mut tx, std::slice::from_ref(&job.key))
        .await?
        .pop()
    else {
        return Ok(());
    };
    match guarded(&job, handler.handle(&mut tx, &job))
        .instrument(spans.handler(&job))
        .await
    {
        Ok(()) => {
            let completing = spans.completing(std::iter::once(&job));
            ctx.queue.complete_in_tx(&mut tx, std::slice::from_ref(&job)).await?;
            tx.commit().await.map_err(EngineError::db("committing a job"))?;
            drop(completing);
            ctx.stats.count(&ctx.queue, "settled", &ctx.stats.settled, 1);
            spans.outcome(&job.key, "settled");
            Ok(())
        }
        Err(err) => {
            let _ = tx.rollback().await;
            drop(conn);
            record_failure(ctx, &job, err, spans).await
        }
    }
}

/// After the job's transaction rolled back: a snooze (no attempt spent),
/// or a failed attempt (retried after a backoff, or a dead letter).
async fn record_failure(ctx: &Ctx, job: &ClaimedJob, err: HandlerError, spans: &JobSpans) -> Result<(), EngineError> {
    let err = failure::unless_fatal(job, err)?;
    let mut conn = ctx.conn().await?;
    failure::record(ctx, &mut conn, Held::Unclaimed, job, &err, spans).await
}

/// A handler error that is the connection's or the server's, not the
/// job's: the connection went away, the server is shutting down or
/// recovering, or it is read-only (a primary just demoted). A
/// serialization failure or a deadlock is the job's, and counts.
fn is_lost_connection(err: &HandlerError) -> bool {
    let HandlerError::Database(err) = err else {
        return false;
    };
    match err {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            code == "25006" || code.starts_with("08") || code.starts_with("57")
        }
        other => is_transient_sqlx(other),
    }
}
