//! The worker registry (`settled_engine.workers`): who is working, from which
//! host and process, and when it was last heard from (database clock). A
//! [`Worker`] registers itself, beats every [`WORKER_HEARTBEAT_SECS`] with
//! its counters, marks silent workers dead, and records its stop.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::batch::queue::WorkQueue;
use crate::batch::stats::DrainStats;
use crate::common::error::EngineError;

/// Seconds between a worker's heartbeats.
pub const WORKER_HEARTBEAT_SECS: u64 = 5;
/// Longest a stopping worker waits to record its stop.
pub const WORKER_STOP_RECORD_MS: u64 = 2_000;

/// A registered worker process: its id, its counters, its heartbeat.
#[derive(Debug)]
pub struct Worker {
    pool: PgPool,
    id: Uuid,
    stats: Arc<DrainStats>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Worker {
    /// Registers this process and starts its heartbeat.
    pub async fn register(pool: &PgPool, version: &str) -> Result<Worker, EngineError> {
        let id = match register(pool, version).await {
            Ok(id) => id,
            Err(err) => return Err(err.refused(pool).await),
        };
        let stats = Arc::new(DrainStats::default());
        let heartbeat = tokio::spawn(heartbeat_loop(pool.clone(), id, stats.clone()));
        Ok(Worker {
            pool: pool.clone(),
            id,
            stats,
            heartbeat,
        })
    }

    /// The worker's id.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Its counters (shared with its drains and its metrics).
    pub fn stats(&self) -> &Arc<DrainStats> {
        &self.stats
    }

    /// Asks its drains to stop claiming; the work in flight finishes.
    pub fn request_stop(&self) {
        self.stats.stop.store(true, Ordering::Relaxed);
    }

    /// True once a stop was requested.
    pub fn stop_requested(&self) -> bool {
        self.stats.stop.load(Ordering::Relaxed)
    }

    /// Stops the heartbeat and records the stop with the final counters,
    /// waiting at most [`WORKER_STOP_RECORD_MS`] for the database (a worker
    /// that gave up on it must not wait for it again; the registry marks a
    /// silent worker dead).
    pub async fn deregister(self) {
        self.heartbeat.abort();
        let budget = Duration::from_millis(WORKER_STOP_RECORD_MS);
        let recorded = match tokio::time::timeout(budget, stopped(&self.pool, self.id, &self.stats)).await {
            Ok(recorded) => recorded.map_err(|err| err.to_string()),
            Err(_) => Err(format!("no answer within {budget:?}")),
        };
        if let Err(error) = recorded {
            tracing::warn!(
                error,
                "could not record the worker's stop; the registry will mark it dead"
            );
        }
        let s = &self.stats;
        tracing::info!(
            worker = %self.id,
            settled = s.items_settled.load(Ordering::Relaxed),
            failed = s.items_failed.load(Ordering::Relaxed),
            retried = s.items_retried.load(Ordering::Relaxed),
            fence_rejections = s.fence_rejections.load(Ordering::Relaxed),
            leases_rescued = s.leases_rescued.load(Ordering::Relaxed),
            leases_released = s.leases_released.load(Ordering::Relaxed),
            "worker stopped"
        );
    }
}

async fn heartbeat_loop(pool: PgPool, worker: Uuid, stats: Arc<DrainStats>) {
    let mut tick = tokio::time::interval(Duration::from_secs(WORKER_HEARTBEAT_SECS));
    let mut beats = 0u64;
    let mut failing = false;
    loop {
        tick.tick().await;
        // One line when heartbeats start failing, one when they work again.
        match heartbeat(&pool, worker, &stats).await {
            Err(err) if !failing => {
                failing = true;
                tracing::warn!(error = %err, "worker heartbeat failed; retrying every beat");
            }
            Err(_) => continue,
            Ok(()) if failing => {
                failing = false;
                tracing::info!("worker heartbeat works again");
            }
            Ok(()) => {}
        }
        beats += 1;
        if beats % 12 == 1 {
            match mark_dead_and_prune(&pool).await {
                Ok(RegistryUpkeep { dead: 0, pruned: 0 }) => {}
                Ok(RegistryUpkeep { dead, pruned }) => {
                    tracing::info!(dead, pruned, "worker registry: marked dead, pruned")
                }
                // A least-privilege worker may not delete: pruning is left to others.
                Err(err) => tracing::debug!(error = %err, "worker registry upkeep failed"),
            }
        }
    }
}

/// Registers this process as a worker and returns its id.
async fn register(pool: &PgPool, version: &str) -> Result<Uuid, EngineError> {
    let id = Uuid::new_v4();
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".to_string());
    sqlx::query("INSERT INTO settled_engine.workers (id, host, pid, version) VALUES ($1, $2, $3, $4)")
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
    // A worker marked dead while it was paused comes back to life here.
    sqlx::query(
        "UPDATE settled_engine.workers
         SET heartbeat_at = now(), items_settled = $2, items_failed = $3,
             fence_rejections = $4, leases_rescued = $5,
             ended = CASE WHEN ended = 'dead' THEN NULL ELSE ended END,
             stopped_at = CASE WHEN ended = 'dead' THEN NULL ELSE stopped_at END
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
    sqlx::query("UPDATE settled_engine.workers SET stopped_at = now(), ended = 'stopped' WHERE id = $1")
        .bind(worker)
        .execute(pool)
        .await
        .map_err(EngineError::db("recording a worker stop"))?;
    Ok(())
}

/// A worker without a heartbeat for this long is marked dead.
pub const WORKER_DEAD_AFTER_SECS: i64 = 60;
/// Rows of ended workers are kept this long, then pruned.
pub const WORKER_RETENTION_DAYS: i64 = 7;

/// What one upkeep of the worker registry did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryUpkeep {
    /// Silent workers marked dead.
    pub dead: u64,
    /// Rows of ended workers pruned.
    pub pruned: u64,
}

/// Marks silent workers dead and prunes ended ones past retention.
pub async fn mark_dead_and_prune(pool: &PgPool) -> Result<RegistryUpkeep, EngineError> {
    let dead = sqlx::query(
        "UPDATE settled_engine.workers SET ended = 'dead', stopped_at = heartbeat_at
         WHERE stopped_at IS NULL AND heartbeat_at < now() - make_interval(secs => $1)",
    )
    .bind(WORKER_DEAD_AFTER_SECS as f64)
    .execute(pool)
    .await
    .map_err(EngineError::db("marking dead workers"))?
    .rows_affected();
    let pruned = sqlx::query("DELETE FROM settled_engine.workers WHERE stopped_at < now() - make_interval(days => $1)")
        .bind(WORKER_RETENTION_DAYS as i32)
        .execute(pool)
        .await
        .map_err(EngineError::db("pruning ended workers"))?
        .rows_affected();
    Ok(RegistryUpkeep { dead, pruned })
}

/// A row of the worker registry, as operators see it.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct WorkerRow {
    /// Worker id.
    pub id: Uuid,
    /// Host name.
    pub host: String,
    /// OS process id.
    pub pid: i32,
    /// Version.
    pub version: String,
    /// Registration time.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Last heartbeat.
    pub heartbeat_at: chrono::DateTime<chrono::Utc>,
    /// Seconds since the last heartbeat (database clock).
    pub heartbeat_age_secs: f64,
    /// `alive`, `stopped` or `dead`.
    pub state: String,
    /// Items it settled.
    pub items_settled: i64,
    /// Items it failed.
    pub items_failed: i64,
    /// Its completions refused by the fence.
    pub fence_rejections: i64,
    /// Leases it holds now (leased mode).
    pub leases_held: i64,
}

/// Lists workers, alive first, newest first. `leases_table` is the work
/// table whose leases to count (None: count none).
pub async fn list(pool: &PgPool, leases_table: Option<&WorkQueue>, limit: i64) -> Result<Vec<WorkerRow>, EngineError> {
    let held_sql = match leases_table {
        Some(q) => format!(
            "(SELECT count(*) FROM {} i WHERE i.status = 'processing' AND i.lease_owner = w.id)",
            q.spec().table
        ),
        None => "0::bigint".to_string(),
    };
    sqlx::query_as(&format!(
        "SELECT w.id, w.host, w.pid, w.version, w.started_at, w.heartbeat_at,
                extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_secs,
                CASE WHEN w.ended IS NOT NULL THEN w.ended
                     WHEN w.heartbeat_at < now() - make_interval(secs => $2) THEN 'dead'
                     ELSE 'alive' END AS state,
                w.items_settled, w.items_failed, w.fence_rejections, {held_sql} AS leases_held
         FROM settled_engine.workers w
         ORDER BY (w.stopped_at IS NULL) DESC, w.started_at DESC
         LIMIT $1"
    ))
    .bind(limit) // $1
    .bind(WORKER_DEAD_AFTER_SECS as f64) // $2
    .fetch_all(pool)
    .await
    .map_err(EngineError::db("listing workers"))
}

/// Sums over the registry, for metrics.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, sqlx::FromRow)]
pub struct WorkerTotals {
    /// Completions refused by the fence, all workers.
    pub fence_rejections: i64,
    /// Expired leases rescued, all workers.
    pub leases_rescued: i64,
    /// Workers with a heartbeat within [`WORKER_DEAD_AFTER_SECS`].
    pub alive: i64,
    /// Seconds since the oldest heartbeat of a worker not stopped (0: none).
    pub oldest_heartbeat_age_secs: f64,
    /// The last moment a worker counted as alive: a stopped worker's stop,
    /// another's last heartbeat plus [`WORKER_DEAD_AFTER_SECS`] (None: no
    /// worker in the registry). With `alive` at 0, since when none is.
    pub alive_until: Option<chrono::DateTime<chrono::Utc>>,
}

/// Reads [`WorkerTotals`].
pub async fn totals(pool: &PgPool) -> Result<WorkerTotals, EngineError> {
    sqlx::query_as(
        "SELECT coalesce(sum(fence_rejections), 0)::bigint AS fence_rejections,
                coalesce(sum(leases_rescued), 0)::bigint AS leases_rescued,
                count(*) FILTER (WHERE stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => $1)) AS alive,
                coalesce(extract(epoch FROM now() - min(heartbeat_at) FILTER (WHERE stopped_at IS NULL)), 0)::float8
                    AS oldest_heartbeat_age_secs,
                max(CASE WHEN ended = 'stopped' THEN stopped_at
                         ELSE heartbeat_at + make_interval(secs => $1) END) AS alive_until
         FROM settled_engine.workers",
    )
    .bind(WORKER_DEAD_AFTER_SECS as f64) // $1
    .fetch_one(pool)
    .await
    .map_err(EngineError::db("summing the worker registry"))
}
