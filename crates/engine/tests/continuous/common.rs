//! What the continuous-queue tests share: a database with the engine's
//! migrations and one queue (`mail` on `jobs.queue`), an effects table with
//! no unique key (so a duplicate effect would be counted, not refused),
//! and scripted handlers for both modes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use settled_engine::continuous::{ClaimedJob, JobHandler, LeasedJobHandler, Queue, ServeConfig, ServeStats, Wake};
use settled_engine::{HandlerError, LeaseConfig};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

pub(crate) const QUEUE: &str = "mail";
pub(crate) const TABLE: &str = "jobs.queue";

pub(crate) fn queue() -> Arc<Queue> {
    Arc::new(Queue::new(QUEUE, TABLE).unwrap())
}

pub(crate) struct Env {
    pub pool: PgPool,
    pub db: settled_testkit::TestDb,
}

/// A fresh database with the queue's table and an effects table.
pub(crate) async fn env() -> Env {
    // A copy of a database migrated and set up once per test binary.
    let db = settled_testkit::TestDb::create_prepared_on_pool("continuous", |pool| async move {
        settled_engine::migrate(&pool).await.map_err(|e| e.to_string())?;
        setup(&pool).await;
        Ok(())
    })
    .await
    .unwrap();
    let pool = PgPoolOptions::new().max_connections(40).connect(&db.url).await.unwrap();
    Env { pool, db }
}

/// The queue's table and the effects table on `pool`'s database.
pub(crate) async fn setup(pool: &PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("CREATE SCHEMA jobs").execute(&mut *conn).await.unwrap();
    queue().create_table(&mut conn).await.unwrap();
    sqlx::query(
        "CREATE TABLE jobs.effects (key text NOT NULL, fence bigint NOT NULL, worker text NOT NULL,
                                    at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
}

pub(crate) async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A config for tests: short poll and backoff, quick leases.
pub(crate) fn config(concurrency: u32, batch: u32) -> ServeConfig {
    let mut cfg = ServeConfig {
        concurrency,
        batch,
        poll: Duration::from_millis(200),
        lease: LeaseConfig {
            ttl: Duration::from_secs(2),
            rescue_interval: Duration::from_millis(300),
            shutdown_grace: Duration::from_secs(2),
            calls_in_flight: 64,
        },
        ..ServeConfig::default()
    };
    cfg.retry.max_attempts = 3;
    cfg.retry.backoff_base_ms = 10;
    cfg.retry.backoff_cap_ms = 50;
    cfg
}

/// Polling only, for tests that must not depend on a wake-up.
pub(crate) fn polling(mut cfg: ServeConfig) -> ServeConfig {
    cfg.wake = Wake::Poll;
    cfg
}

/// What a scripted handler does with a job, by key.
#[derive(Default, Clone)]
pub(crate) struct Script {
    /// Refused for good.
    pub poison: HashSet<String>,
    /// Panic while handling.
    pub panics: HashSet<String>,
    /// Snoozed (for this long) instead of handled.
    pub snooze: HashSet<String>,
    /// Each job takes this long.
    pub work: Duration,
    /// Written with each effect.
    pub worker: String,
}

/// In-transaction handler: one effect row per job, on the claim's transaction.
pub(crate) struct TxScripted {
    pub script: Script,
    pub handled: AtomicU64,
}

impl TxScripted {
    pub(crate) fn new(script: Script) -> Arc<TxScripted> {
        Arc::new(TxScripted {
            script,
            handled: AtomicU64::new(0),
        })
    }
}

impl Script {
    fn check(&self, job: &ClaimedJob) -> Result<(), HandlerError> {
        if self.poison.contains(&job.key) {
            return Err(HandlerError::Permanent(format!("{} is poison", job.key)));
        }
        if self.panics.contains(&job.key) {
            panic!("scripted panic on {}", job.key);
        }
        if self.snooze.contains(&job.key) {
            return Err(HandlerError::Snooze {
                after: Duration::from_secs(3600),
                reason: "provider down".into(),
            });
        }
        Ok(())
    }
}

impl JobHandler for TxScripted {
    async fn handle(&self, tx: &mut PgConnection, job: &ClaimedJob) -> Result<(), HandlerError> {
        self.script.check(job)?;
        if !self.script.work.is_zero() {
            tokio::time::sleep(self.script.work).await;
        }
        sqlx::query("INSERT INTO jobs.effects (key, fence, worker) VALUES ($1, $2, $3)")
            .bind(&job.key)
            .bind(job.fence.packed())
            .bind(&self.script.worker)
            .execute(tx)
            .await?;
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Leased handler: the work is a call to a key-deduplicating receiver
/// (`jobs.receiver`, keyed by the job's key: a second call with the same
/// key is absorbed and counted); the effect row is written with the
/// completion.
pub(crate) struct LeasedScripted {
    pub script: Script,
    pub pool: PgPool,
}

impl LeasedJobHandler for LeasedScripted {
    type Output = bool;

    async fn work(&self, job: &ClaimedJob) -> Result<bool, HandlerError> {
        self.script.check(job)?;
        if !self.script.work.is_zero() {
            tokio::time::sleep(self.script.work).await;
        }
        let first: bool = sqlx::query_scalar(
            "INSERT INTO jobs.receiver (key, calls) VALUES ($1, 1)
             ON CONFLICT (key) DO UPDATE SET calls = jobs.receiver.calls + 1
             RETURNING calls = 1",
        )
        .bind(&job.key)
        .fetch_one(&self.pool)
        .await?;
        Ok(first)
    }

    async fn complete(&self, tx: &mut PgConnection, done: &[(ClaimedJob, bool)]) -> Result<(), HandlerError> {
        let keys: Vec<&str> = done.iter().map(|(j, _)| j.key.as_str()).collect();
        let fences: Vec<i64> = done.iter().map(|(j, _)| j.fence.packed()).collect();
        sqlx::query(
            "INSERT INTO jobs.effects (key, fence, worker) SELECT k, f, $3 FROM unnest($1::text[], $2::bigint[]) AS u(k, f)",
        )
        .bind(keys)
        .bind(fences)
        .bind(&self.script.worker)
        .execute(tx)
        .await?;
        Ok(())
    }
}

/// The receiver's table (leased tests).
pub(crate) async fn receiver(pool: &PgPool) {
    sqlx::query("CREATE TABLE jobs.receiver (key text PRIMARY KEY, calls integer NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// Waits until `sql` returns `want` (or panics after `secs`).
pub(crate) async fn wait_for(pool: &PgPool, sql: &str, want: i64, secs: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let got = count(pool, sql).await;
        if got == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{sql}: {got}, waited for {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (30 s at most) until `want` jobs are in `status`.
pub(crate) async fn wait_for_status(pool: &PgPool, status: &str, want: i64) {
    let sql = format!("SELECT count(*) FROM jobs.queue WHERE status = '{status}'");
    wait_for(pool, &sql, want, 30).await;
}

/// `jobs.effects` holds `n` effects, each of another job.
pub(crate) async fn assert_effects_once(pool: &PgPool, n: i64) {
    assert_eq!(count(pool, "SELECT count(*) FROM jobs.effects").await, n);
    assert_eq!(count(pool, "SELECT count(DISTINCT key) FROM jobs.effects").await, n);
}

/// A serve running in the background, stopped and joined by `stop`.
pub(crate) struct Serving {
    pub stats: Arc<ServeStats>,
    task: tokio::task::JoinHandle<Result<(), settled_engine::EngineError>>,
}

impl Serving {
    pub(crate) fn tx(pool: &PgPool, handler: Arc<TxScripted>, cfg: ServeConfig) -> Serving {
        let stats = Arc::new(ServeStats::default());
        let (pool, s) = (pool.clone(), stats.clone());
        let task =
            tokio::spawn(async move { settled_engine::continuous::serve(&pool, queue(), handler, cfg, s).await });
        Serving { stats, task }
    }

    pub(crate) fn leased(pool: &PgPool, handler: Arc<LeasedScripted>, cfg: ServeConfig) -> Serving {
        let stats = Arc::new(ServeStats::default());
        let (pool, s) = (pool.clone(), stats.clone());
        let task =
            tokio::spawn(
                async move { settled_engine::continuous::serve_leased(&pool, queue(), handler, cfg, s).await },
            );
        Serving { stats, task }
    }

    pub(crate) async fn stop(self) {
        self.stats.request_stop();
        self.task.await.unwrap().unwrap();
    }
}
