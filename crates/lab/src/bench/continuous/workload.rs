//! The continuous workload every system runs, and how it is measured, the
//! same way for all: the bench's own tables in each case's database, the
//! job's payload, the settled handlers (both modes), the measurement SQL
//! and the sampler of the systems' tables.
//!
//! A job carries its id and `enq_us`, the producer's clock just before the
//! enqueue call; its handler takes `started_us` first thing, sleeps the
//! job's work, and writes one row into `bench.effects`, which has no
//! unique key, so a job handled twice leaves two rows. Both times are
//! microseconds since the epoch on this host's clock, the clock the
//! database server (on the same host) reads for `clock_timestamp()`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use settled_engine::{ClaimedJob, HandlerError, JobHandler, LeasedJobHandler, Queue};
use sqlx::{PgConnection, PgPool};

/// The queue settled serves in the bench, and its table.
pub const QUEUE_NAME: &str = "bench";
/// Its work table.
pub const QUEUE_TABLE: &str = "bench_queue.jobs";
/// The bench's own schema (never counted as a system's table).
pub const BENCH_SCHEMA: &str = "bench";

/// The bench's tables: the effects (no unique key: duplicates are counted,
/// not refused) and the key-deduplicating receiver of leased calls.
pub const BENCH_TABLES_SQL: &str = "
CREATE SCHEMA bench;
CREATE TABLE bench.effects (
    job        text        NOT NULL,
    enq_us     bigint      NOT NULL,
    started_us bigint      NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE bench.receiver (job text PRIMARY KEY, calls integer NOT NULL);";

/// The one effect row of a handled job.
pub const INSERT_EFFECT_SQL: &str = "INSERT INTO bench.effects (job, enq_us, started_us) VALUES ($1, $2, $3)";

/// The receiver's call: the first call with a key applies, a repeat is
/// absorbed and counted.
pub const RECEIVER_CALL_SQL: &str = "INSERT INTO bench.receiver (job, calls) VALUES ($1, 1)
     ON CONFLICT (job) DO UPDATE SET calls = bench.receiver.calls + 1";

/// The settled queue of the bench.
pub fn queue() -> Queue {
    Queue::new(QUEUE_NAME, QUEUE_TABLE).expect("valid queue names")
}

/// Microseconds since the epoch, now.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What a job carries.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Payload {
    /// When the producer called enqueue, µs since the epoch.
    pub enq_us: i64,
}

/// The settled handler in in-transaction mode: the effect row is written
/// on the claiming transaction, so it commits with the job's completion.
pub struct TxWork {
    /// The job's work (a sleep).
    pub work: Duration,
}

impl JobHandler for TxWork {
    async fn handle(&self, tx: &mut PgConnection, job: &ClaimedJob) -> Result<(), HandlerError> {
        let started_us = now_us();
        let payload: Payload = job.payload_as()?;
        tokio::time::sleep(self.work).await;
        sqlx::query(INSERT_EFFECT_SQL)
            .bind(&job.key) // $1
            .bind(payload.enq_us) // $2
            .bind(started_us) // $3
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// The settled handler in leased mode: the work, then a call to the
/// receiver keyed by the job's key (outside any transaction, like an
/// external call); the effect row commits with the fenced completion.
pub struct LeasedWork {
    /// The job's work (a sleep).
    pub work: Duration,
    /// Where the receiver lives.
    pub pool: PgPool,
}

/// What a leased job's work hands to its completion.
#[derive(Debug, Clone)]
pub struct Started {
    enq_us: i64,
    started_us: i64,
}

impl LeasedJobHandler for LeasedWork {
    type Output = Started;

    async fn work(&self, job: &ClaimedJob) -> Result<Started, HandlerError> {
        let started_us = now_us();
        let payload: Payload = job.payload_as()?;
        tokio::time::sleep(self.work).await;
        sqlx::query(RECEIVER_CALL_SQL)
            .bind(&job.key) // $1
            .execute(&self.pool)
            .await?;
        Ok(Started {
            enq_us: payload.enq_us,
            started_us,
        })
    }

    async fn complete(&self, tx: &mut PgConnection, done: &[(ClaimedJob, Started)]) -> Result<(), HandlerError> {
        let jobs: Vec<&str> = done.iter().map(|(j, _)| j.key.as_str()).collect();
        let enq: Vec<i64> = done.iter().map(|(_, s)| s.enq_us).collect();
        let started: Vec<i64> = done.iter().map(|(_, s)| s.started_us).collect();
        sqlx::query(
            "INSERT INTO bench.effects (job, enq_us, started_us)
             SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[])",
        )
        .bind(jobs) // $1
        .bind(enq) // $2
        .bind(started) // $3
        .execute(tx)
        .await?;
        Ok(())
    }
}

/// What the effects say about a case's measurement window.
#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct Measured {
    /// Distinct jobs whose effect committed in the window.
    pub completed: i64,
    /// Pickup (enqueue call to handler start) of the jobs that started in
    /// the window, first handling of each, ms.
    pub pickup_p50_ms: Option<f64>,
    /// Its 99th percentile, ms.
    pub pickup_p99_ms: Option<f64>,
    /// Effect rows beyond one per job, over the whole case.
    pub duplicates: i64,
    /// Repeated receiver calls absorbed by its key, over the whole case.
    pub absorbed: i64,
    /// Distinct jobs handled over the whole case.
    pub jobs_total: i64,
}

/// Reads the effects of the window `[from_us, to_us)`.
pub async fn measure(pool: &PgPool, from_us: i64, to_us: i64) -> anyhow::Result<Measured> {
    Ok(sqlx::query_as(
        "WITH first AS (
             SELECT job, min(started_us) AS started_us, min(enq_us) AS enq_us, min(at) AS at
             FROM bench.effects GROUP BY job)
         SELECT
             (SELECT count(*) FROM first
              WHERE at >= to_timestamp($1 / 1e6) AND at < to_timestamp($2 / 1e6)) AS completed,
             (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY started_us - enq_us) / 1000.0
              FROM first WHERE started_us >= $1 AND started_us < $2) AS pickup_p50_ms,
             (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY started_us - enq_us) / 1000.0
              FROM first WHERE started_us >= $1 AND started_us < $2) AS pickup_p99_ms,
             (SELECT count(*) - count(DISTINCT job) FROM bench.effects) AS duplicates,
             (SELECT coalesce(sum(calls - 1), 0)::int8 FROM bench.receiver) AS absorbed,
             (SELECT count(*) FROM first) AS jobs_total",
    )
    .bind(from_us) // $1
    .bind(to_us) // $2
    .fetch_one(pool)
    .await?)
}

/// One sample of the system's tables (every user table outside `bench`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct TableSample {
    /// Seconds since the producer started.
    #[sqlx(default)]
    pub t_s: f64,
    /// Dead tuples, summed over the system's tables.
    pub dead_tuples: i64,
    /// Live tuples, summed.
    pub live_tuples: i64,
    /// Their total size (heap, indexes, TOAST), bytes.
    pub table_bytes: i64,
}

/// Samples the system's tables now.
pub async fn sample_tables(pool: &PgPool) -> anyhow::Result<TableSample> {
    Ok(sqlx::query_as(
        "SELECT coalesce(sum(n_dead_tup), 0)::int8 AS dead_tuples,
                coalesce(sum(n_live_tup), 0)::int8 AS live_tuples,
                coalesce(sum(pg_total_relation_size(relid)), 0)::int8 AS table_bytes
         FROM pg_stat_user_tables WHERE schemaname <> $1",
    )
    .bind(BENCH_SCHEMA) // $1
    .fetch_one(pool)
    .await?)
}

/// What the case's database has done so far, from `pg_stat_database`.
#[derive(Debug, Clone, Copy, Default, sqlx::FromRow)]
pub struct DbWork {
    /// Transactions committed and rolled back.
    pub transactions: i64,
    /// Rows inserted, updated and deleted.
    pub row_writes: i64,
}

/// Reads the case's database's counters now.
pub async fn db_work(pool: &PgPool) -> anyhow::Result<DbWork> {
    Ok(sqlx::query_as(
        "SELECT (xact_commit + xact_rollback)::int8 AS transactions,
                (tup_inserted + tup_updated + tup_deleted)::int8 AS row_writes
         FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?)
}
