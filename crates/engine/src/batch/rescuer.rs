//! The rescuer: returns expired leases of a scope to `eligible` (after a
//! backoff) or `failed` (attempts spent). Any worker may run it; a
//! transaction-level advisory lock keyed by the job lets one run at a time
//! per job, and claims never take that lock, so rescuing blocks no claim.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::batch::queue::WorkQueue;
use crate::batch::runs::notify_items_eligible;
use crate::batch::stats::DrainStats;
use crate::common::error::EngineError;
use crate::common::retry::{FailOutcome, RetryPolicy};

/// Rescues the scope's expired leases once, unless another rescuer of the
/// same job is at it (then returns None).
pub async fn rescue_expired_leases(
    pool: &PgPool,
    queue: &WorkQueue,
    scope: &str,
    policy: &RetryPolicy,
) -> Result<Option<FailOutcome>, EngineError> {
    let mut tx = pool.begin().await.map_err(EngineError::db("beginning a rescue"))?;
    let ours: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('work-queue-rescuer'), hashtext($1))")
            .bind(queue.job())
            .fetch_one(&mut *tx)
            .await
            .map_err(EngineError::db("taking the rescuer lock"))?;
    if !ours {
        tx.rollback().await.map_err(EngineError::db("ending a rescue"))?;
        return Ok(None);
    }
    let outcome = queue.rescue_expired(&mut tx, scope, policy).await?;
    if outcome.retried > 0 {
        notify_items_eligible(&mut tx, queue.job()).await?;
    }
    tx.commit().await.map_err(EngineError::db("committing a rescue"))?;
    Ok(Some(outcome))
}

/// Runs the rescuer every `interval` until the task is dropped.
pub async fn keep_rescuing(
    pool: PgPool,
    queue: Arc<WorkQueue>,
    scope: String,
    policy: RetryPolicy,
    interval: Duration,
    stats: Arc<DrainStats>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match rescue_expired_leases(&pool, &queue, &scope, &policy).await {
            Ok(Some(outcome)) if outcome.retried + outcome.failed > 0 => {
                stats
                    .leases_rescued
                    .fetch_add(outcome.retried + outcome.failed, Ordering::Relaxed);
                stats.items_failed.fetch_add(outcome.failed, Ordering::Relaxed);
                tracing::warn!(
                    scope = %scope, retried = outcome.retried, failed = outcome.failed,
                    "rescued expired leases"
                );
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(scope = %scope, error = %err, "rescue failed"),
        }
    }
}
