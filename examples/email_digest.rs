//! A job that is not settlement: send each subscriber its digest exactly
//! once, with several claim loops splitting the work, through the engine's
//! API alone (no SQL against the engine's tables, nor its bookkeeping columns written by hand).
//!
//! `cargo run -p settled-engine --example email_digest` uses `DATABASE_URL`,
//! or a throwaway private PostgreSQL when it is unset.
//!
//! The work table `digest.outbox` has a scope (`week`), a key (`subscriber`)
//! and the engine's bookkeeping columns; the effect is a row in
//! `digest.sent`, whose primary key would refuse a second send. A digest
//! whose topic is `bounce` is refused (permanently) by the handler: it fails
//! alone, and an operator's retry sends it once the topic is fixed.

use std::sync::Arc;

use settled_engine::{
    Chunk, ChunkHandler, DrainConfig, Handled, HandlerError, InTransaction, Job, NoHooks, QueueSpec, WorkOutcome,
    WorkQueue, Worker,
};
use sqlx::{PgConnection, PgPool};

/// The example's own columns of the work table; the engine adds its scope,
/// key and bookkeeping columns and indexes ([`WorkQueue::table_sql`]).
const OUTBOX_COLUMNS: &str = "topic text NOT NULL";

/// Where a digest sent is recorded: its key refuses a second send.
const SENT_SQL: &str = "CREATE TABLE IF NOT EXISTS digest.sent (
    week       date NOT NULL,
    subscriber text NOT NULL,
    body       text NOT NULL,
    PRIMARY KEY (week, subscriber))";

/// The digest job: its work table, no extra hooks (any week with items may
/// start; the report is the engine's counts; a due time covers its own date).
pub(crate) fn job() -> Job<NoHooks> {
    let queue = WorkQueue::new(QueueSpec {
        job: "weekly-digest".into(),
        table: "digest.outbox".into(),
        scope_column: "week".into(),
        scope_type: "date".into(),
        key_column: "subscriber".into(),
        key_type: "text".into(),
    })
    .expect("a valid spec");
    Job::new(queue, NoHooks)
}

/// "Sends" a chunk of digests: renders each body and records the send, in
/// the claiming transaction. A `bounce` topic is refused.
pub(crate) struct SendDigests;

impl ChunkHandler for SendDigests {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        let bounced: Option<String> = sqlx::query_scalar(
            "SELECT subscriber FROM digest.outbox
             WHERE week = $1::date AND subscriber = ANY($2) AND topic = 'bounce' LIMIT 1",
        )
        .bind(&chunk.scope)
        .bind(chunk.keys())
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(subscriber) = bounced {
            return Err(HandlerError::Permanent(format!(
                "{subscriber}: the mail server refused it"
            )));
        }
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

/// How a worker drains the digest job.
pub(crate) fn drainer() -> InTransaction<SendDigests> {
    InTransaction(Arc::new(SendDigests))
}

/// Four claim loops of 50 digests.
pub(crate) fn drain_config() -> DrainConfig {
    DrainConfig {
        chunk: 50,
        concurrency: 4,
        ..DrainConfig::default()
    }
}

/// Creates the engine's and the example's tables (once).
pub(crate) async fn install(pool: &PgPool) -> anyhow::Result<()> {
    settled_engine::migrate(pool).await?;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS digest").execute(pool).await?;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('digest.outbox') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        sqlx::raw_sql(&job().queue().table_sql(OUTBOX_COLUMNS))
            .execute(pool)
            .await?;
    }
    sqlx::query(SENT_SQL).execute(pool).await?;
    job().check_work_table(pool).await?;
    Ok(())
}

/// Enqueues `subscribers` digests for `week` (the `bounce` subscriber, if
/// given, gets the topic the handler refuses).
pub(crate) async fn enqueue(pool: &PgPool, week: &str, subscribers: i64, bounce: Option<i64>) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO digest.outbox (week, subscriber, topic)
         SELECT $1::date, 'subscriber-' || i,
                CASE WHEN i = $3 THEN 'bounce' ELSE (ARRAY['rust', 'postgres', 'queues'])[1 + i % 3] END
         FROM generate_series(1, $2::bigint) i
         ON CONFLICT DO NOTHING",
    )
    .bind(week)
    .bind(subscribers)
    .bind(bounce)
    .execute(pool)
    .await?;
    Ok(())
}

/// Digests sent for `week`.
pub(crate) async fn sent(pool: &PgPool, week: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM digest.sent WHERE week = $1::date")
            .bind(week)
            .fetch_one(pool)
            .await?,
    )
}

/// Enqueues `subscribers` digests for `week` and lets one worker of this
/// process take its turn at the week's run (start or join, drain, finish).
pub(crate) async fn send_weekly_digests(
    pool: &PgPool,
    week: &str,
    subscribers: i64,
) -> anyhow::Result<(WorkOutcome, i64)> {
    install(pool).await?;
    enqueue(pool, week, subscribers, None).await?;
    let worker = Worker::register(pool, "example").await?;
    let outcome = job().work(pool, week, &drainer(), &drain_config(), &worker).await;
    worker.deregister().await;
    Ok((outcome?, sent(pool, week).await?))
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // DATABASE_URL, else a throwaway database dropped at the end.
    let (url, _db) = settled_testkit::TestDb::from_env_or_create().await?;
    let pool = PgPool::connect(&url).await?;
    let (outcome, sent) = send_weekly_digests(&pool, "2026-11-23", 5_000).await?;
    println!("weekly digest: {sent} of 5000 subscribers sent exactly once ({outcome:?})");
    pool.close().await;
    anyhow::ensure!(sent == 5_000, "some digests were not sent");
    Ok(())
}
