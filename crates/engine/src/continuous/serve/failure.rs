//! A failed attempt, the same in both modes: a fatal error stops the
//! serve; a snooze spends no attempt; anything else is retried after a
//! backoff or becomes a dead letter.

use sqlx::PgConnection;

use super::super::finish::Held;
use super::super::ClaimedJob;
use super::spans::JobSpans;
use super::Ctx;
use crate::common::error::{EngineError, HandlerError};
use crate::common::retry::Failure;

/// The error back when it is the job's, or the serve's stop when it is
/// fatal (a missing grant or migration is not the job's fault).
pub(super) fn unless_fatal(job: &ClaimedJob, err: HandlerError) -> Result<HandlerError, EngineError> {
    if err.is_fatal() {
        return Err(EngineError::Handler {
            items: 1,
            first_key: job.key.clone(),
            source: err,
        });
    }
    Ok(err)
}

/// Records `job`'s failed attempt on `conn`, as the mode holds it
/// (`held`): a snooze, a retry or a dead letter.
pub(super) async fn record(
    ctx: &Ctx,
    conn: &mut PgConnection,
    held: Held,
    job: &ClaimedJob,
    err: &HandlerError,
    spans: &JobSpans,
) -> Result<(), EngineError> {
    let jobs = std::slice::from_ref(job);
    if let HandlerError::Snooze { after, reason } = err {
        let n = ctx.queue.snooze(conn, held, jobs, *after, reason).await?;
        ctx.stats.count(&ctx.queue, "snoozed", &ctx.stats.snoozed, n);
        spans.outcome(&job.key, "snoozed");
        return Ok(());
    }
    let failure = Failure {
        error: &err.to_string(),
        permanent: err.is_permanent(),
    };
    let outcome = ctx.queue.fail(conn, held, jobs, failure, &ctx.cfg.retry).await?;
    ctx.stats
        .count(&ctx.queue, "retried", &ctx.stats.retried, outcome.retried);
    ctx.stats.count(&ctx.queue, "failed", &ctx.stats.failed, outcome.failed);
    spans.outcome(&job.key, if outcome.failed == 1 { "failed" } else { "retried" });
    tracing::warn!(
        queue = ctx.queue.name(), job = %job.key, attempt = job.attempt,
        failed = outcome.failed == 1, error = %err, "job attempt failed"
    );
    Ok(())
}
