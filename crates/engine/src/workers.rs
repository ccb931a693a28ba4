//! The worker registry (`settled_engine.workers`): who is working, from which
//! host and process, and when it was last heard from (database clock).

use std::sync::atomic::Ordering;

use sqlx::PgPool;
use uuid::Uuid;

use crate::{DrainStats, EngineError};

/// Registers this process as a worker and returns its id.
pub async fn register(pool: &PgPool, version: &str) -> Result<Uuid, EngineError> {
    let id = Uuid::new_v4();
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".to_string());
    sqlx::query(
        "INSERT INTO settled_engine.workers (id, host, pid, version) VALUES ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(host)
    .bind(std::process::id() as i32)
    .bind(version)
    .execute(pool)
    .await
    .map_err(EngineError::db("registering the worker"))?;
    Ok(id)
}

/// Records that the worker is alive, with its counters so far.
pub async fn heartbeat(pool: &PgPool, worker: Uuid, stats: &DrainStats) -> Result<(), EngineError> {
    sqlx::query(
        "UPDATE settled_engine.workers
         SET heartbeat_at = now(), items_settled = $2, items_failed = $3,
             fence_rejections = $4, leases_rescued = $5
         WHERE id = $1",
    )
    .bind(worker)
    .bind(stats.items_settled.load(Ordering::Relaxed) as i64)
    .bind(stats.items_failed.load(Ordering::Relaxed) as i64)
    .bind(stats.fence_rejections.load(Ordering::Relaxed) as i64)
    .bind(stats.leases_rescued.load(Ordering::Relaxed) as i64)
    .execute(pool)
    .await
    .map_err(EngineError::db("recording a worker heartbeat"))?;
    Ok(())
}

/// Records that the worker stopped on its own, with its final counters.
pub async fn stopped(pool: &PgPool, worker: Uuid, stats: &DrainStats) -> Result<(), EngineError> {
    heartbeat(pool, worker, stats).await?;
    sqlx::query("UPDATE settled_engine.workers SET stopped_at = now() WHERE id = $1")
        .bind(worker)
        .execute(pool)
        .await
        .map_err(EngineError::db("recording a worker stop"))?;
    Ok(())
}
