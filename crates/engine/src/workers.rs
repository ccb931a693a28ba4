//! The worker registry (`settled_engine.workers`): who is working, from which
//! host and process, and when it was last heard from (database clock).

use sqlx::PgPool;
use uuid::Uuid;

use crate::EngineError;

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

/// Records that the worker is alive.
pub async fn heartbeat(pool: &PgPool, worker: Uuid) -> Result<(), EngineError> {
    sqlx::query("UPDATE settled_engine.workers SET heartbeat_at = now() WHERE id = $1")
        .bind(worker)
        .execute(pool)
        .await
        .map_err(EngineError::db("recording a worker heartbeat"))?;
    Ok(())
}

/// Records that the worker stopped on its own.
pub async fn stopped(pool: &PgPool, worker: Uuid) -> Result<(), EngineError> {
    sqlx::query(
        "UPDATE settled_engine.workers SET stopped_at = now(), heartbeat_at = now() WHERE id = $1",
    )
    .bind(worker)
    .execute(pool)
    .await
    .map_err(EngineError::db("recording a worker stop"))?;
    Ok(())
}
