//! A job that is not settlement: send each subscriber its weekly digest
//! exactly once, with several claim loops splitting the work.
//!
//! `cargo run -p settled-engine --example email_digest` uses `DATABASE_URL`,
//! or a throwaway private PostgreSQL when it is unset.
//!
//! The work table `digest.outbox` has a scope (`week`), a key (`subscriber`)
//! and the engine's bookkeeping columns; the effect is a row in
//! `digest.sent`, whose primary key would refuse a second send.

use std::sync::Arc;

use settled_engine::{runs, Chunk, ChunkHandler, DrainConfig, DrainStats, Handled, HandlerError, QueueSpec, WorkQueue};
use sqlx::{PgConnection, PgPool};

const SCHEMA_SQL: &[&str] = &[
    "CREATE SCHEMA IF NOT EXISTS digest",
    "CREATE TABLE IF NOT EXISTS digest.outbox (
        week        date        NOT NULL,
        subscriber  text        NOT NULL,
        topic       text        NOT NULL,
        status      text        NOT NULL DEFAULT 'eligible',
        attempt     integer     NOT NULL DEFAULT 0,
        attempt_base integer    NOT NULL DEFAULT 0,
        lease_owner uuid,
        lease_until timestamptz,
        not_before  timestamptz,
        last_error  text,
        updated_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (week, subscriber))",
    "CREATE INDEX IF NOT EXISTS outbox_eligible ON digest.outbox (week, subscriber) WHERE status = 'eligible'",
    "CREATE INDEX IF NOT EXISTS outbox_processing ON digest.outbox (week, lease_until) WHERE status = 'processing'",
    "CREATE TABLE IF NOT EXISTS digest.sent (
        week       date NOT NULL,
        subscriber text NOT NULL,
        body       text NOT NULL,
        PRIMARY KEY (week, subscriber))",
];

/// "Sends" a chunk of digests: renders each body and records the send, in
/// the claiming transaction.
struct SendDigests;

impl ChunkHandler for SendDigests {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        sqlx::query(
            "INSERT INTO digest.sent (week, subscriber, body)
             SELECT week, subscriber, 'Your ' || topic || ' digest for the week of ' || week
             FROM digest.outbox WHERE week = $1::date AND subscriber = ANY($2)",
        )
        .bind(&chunk.scope)
        .bind(chunk.keys())
        .execute(tx)
        .await?;
        Ok(Handled::default())
    }
}

/// Enqueues `subscribers` digests for `week`, drains them with four claim
/// loops, and returns (digests sent, subscribers enqueued).
pub async fn send_weekly_digests(pool: &PgPool, week: &str, subscribers: i64) -> anyhow::Result<(i64, i64)> {
    settled_engine::migrate::migrate(pool).await?;
    for statement in SCHEMA_SQL {
        sqlx::query(statement).execute(pool).await?;
    }
    sqlx::query(
        "INSERT INTO digest.outbox (week, subscriber, topic)
         SELECT $1::date, 'subscriber-' || i, (ARRAY['rust', 'postgres', 'queues'])[1 + i % 3]
         FROM generate_series(1, $2::bigint) i
         ON CONFLICT DO NOTHING",
    )
    .bind(week)
    .bind(subscribers)
    .execute(pool)
    .await?;

    let queue = Arc::new(WorkQueue::new(QueueSpec {
        job: "weekly-digest".into(),
        table: "digest.outbox".into(),
        scope_column: "week".into(),
        scope_type: "date".into(),
        key_column: "subscriber".into(),
        key_type: "text".into(),
    })?);
    let worker = settled_engine::workers::register(pool, "example").await?;
    let run = {
        let mut conn = pool.acquire().await?;
        runs::start_or_join(&mut conn, queue.job(), week, worker).await?.run
    };
    let stats = Arc::new(DrainStats::default());
    let cfg = DrainConfig {
        chunk: 50,
        concurrency: 4,
        ..DrainConfig::default()
    };
    settled_engine::drain_in_transactions(pool, queue.clone(), run.id, week, Arc::new(SendDigests), &cfg, stats)
        .await?;
    let mut conn = pool.acquire().await?;
    let counts = queue.count_by_status(&mut conn, week).await?;
    runs::finish(&mut conn, run.id, worker, &serde_json::json!({ "counts": counts })).await?;
    let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM digest.sent WHERE week = $1::date")
        .bind(week)
        .fetch_one(&mut *conn)
        .await?;
    let enqueued: i64 = sqlx::query_scalar("SELECT count(*) FROM digest.outbox WHERE week = $1::date")
        .bind(week)
        .fetch_one(&mut *conn)
        .await?;
    Ok((sent, enqueued))
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (url, _db) = match std::env::var("DATABASE_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let db = settled_testkit::TestDb::create().await?;
            (db.url.clone(), Some(db))
        }
    };
    let pool = PgPool::connect(&url).await?;
    let (sent, enqueued) = send_weekly_digests(&pool, "2026-11-23", 5_000).await?;
    println!("weekly digest: {sent} of {enqueued} subscribers sent exactly once");
    pool.close().await;
    anyhow::ensure!(sent == enqueued, "some digests were not sent");
    Ok(())
}
