//! What the batch tests share: a generic work table (`jobs.items`, scoped
//! by day), a job over it, and a scripted handler.

use std::sync::Arc;

use settled_engine::{Chunk, ChunkHandler, DrainConfig, Handled, HandlerError, InTransaction, Job, NoHooks, QueueSpec};
use settled_engine::{RetryPolicy, WorkQueue};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

pub(crate) const SCOPE: &str = "2026-11-28";

pub(crate) const TABLE_SQL: &[&str] = &[
    "CREATE SCHEMA jobs",
    "CREATE TABLE jobs.items (
        day date NOT NULL, item text NOT NULL,
        status text NOT NULL DEFAULT 'eligible', attempt integer NOT NULL DEFAULT 0,
        attempt_base integer NOT NULL DEFAULT 0, fence_epoch integer NOT NULL DEFAULT 0, lease_owner uuid, lease_until timestamptz,
        not_before timestamptz, last_error text, updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (day, item))",
    "CREATE INDEX ON jobs.items (day, item) WHERE status = 'eligible'",
    "CREATE INDEX ON jobs.items (day, lease_until) WHERE status = 'processing'",
    "CREATE INDEX ON jobs.items (item) WHERE status = 'held'",
    // The effect: its primary key refuses a second one.
    "CREATE TABLE jobs.effects (day date NOT NULL, item text NOT NULL, fence integer NOT NULL, PRIMARY KEY (day, item))",
];

pub(crate) fn job() -> Job<NoHooks> {
    job_on("generic", "jobs.items")
}

/// Job `job` on work table `table` (scope `day date`, key `item text`).
pub(crate) fn job_on(job: &str, table: &str) -> Job<NoHooks> {
    Job::new(
        WorkQueue::new(QueueSpec {
            job: job.into(),
            table: table.into(),
            scope_column: "day".into(),
            scope_type: "date".into(),
            key_column: "item".into(),
            key_type: "text".into(),
        })
        .unwrap(),
        NoHooks,
    )
}

pub(crate) struct Env {
    pub pool: PgPool,
    pub db: settled_testkit::TestDb,
}

pub(crate) async fn env(items: i64) -> Env {
    // A copy of a database migrated and set up once per test binary.
    let db = settled_testkit::TestDb::create_prepared_on_pool("batch", |pool| async move {
        settled_engine::migrate(&pool).await.map_err(|e| e.to_string())?;
        for sql in TABLE_SQL {
            sqlx::query(sql).execute(&pool).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    })
    .await
    .unwrap();
    let pool = PgPoolOptions::new().max_connections(60).connect(&db.url).await.unwrap();
    add_items(&pool, SCOPE, items).await;
    Env { pool, db }
}

pub(crate) async fn add_items(pool: &PgPool, scope: &str, items: i64) {
    sqlx::query("INSERT INTO jobs.items (day, item) SELECT $1::date, 'item-' || i FROM generate_series(1, $2) i")
        .bind(scope)
        .bind(items)
        .execute(pool)
        .await
        .unwrap();
}

pub(crate) async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Records the effect of each of `chunk`'s items, with its fence, in
/// `jobs.effects`.
pub(crate) async fn record_effects(tx: &mut PgConnection, chunk: &Chunk) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO jobs.effects SELECT $1::date, k, f FROM unnest($2::text[], $3::int[]) AS x(k, f)")
        .bind(&chunk.scope)
        .bind(chunk.keys())
        .bind(chunk.fences())
        .execute(tx)
        .await?;
    Ok(())
}

/// Records each item's effect with its fence; refuses the keys in `poison`.
pub(crate) struct Scripted {
    pub poison: Vec<String>,
}

impl ChunkHandler for Scripted {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        if let Some(bad) = chunk.items.iter().find(|i| self.poison.contains(&i.key)) {
            return Err(HandlerError::Permanent(format!("{} is poison", bad.key)));
        }
        record_effects(tx, chunk).await?;
        Ok(Handled::default())
    }
}

pub(crate) fn drainer(poison: &[&str]) -> InTransaction<Scripted> {
    InTransaction(Arc::new(Scripted {
        poison: poison.iter().map(|s| s.to_string()).collect(),
    }))
}

pub(crate) fn config(chunk: u32, concurrency: u32) -> DrainConfig {
    DrainConfig {
        chunk,
        concurrency,
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..DrainConfig::default()
    }
}

/// A handler whose chunks are one statement ([`settled_engine::ChunkSql`]):
/// effects in `jobs.sql_effects` (a CHECK refuses `item-77`), holds from
/// `jobs.holds`. Its `handle_chunk` fails everything.
pub(crate) struct InSql;

pub(crate) const SQL_TABLES: &[&str] = &[
    "CREATE TABLE jobs.sql_effects (day date NOT NULL, item text NOT NULL CHECK (item <> 'item-77'),
        fence integer NOT NULL, run bigint NOT NULL, PRIMARY KEY (day, item))",
    "CREATE TABLE jobs.holds (item text PRIMARY KEY)",
];

impl ChunkHandler for InSql {
    /// Never called when the handler has a chunk statement: if the engine
    /// called it, every item would fail and the test with it.
    async fn handle_chunk(&self, _tx: &mut PgConnection, _chunk: &Chunk) -> Result<Handled, HandlerError> {
        Err(HandlerError::Permanent(
            "handle_chunk called for a handler with a chunk statement".into(),
        ))
    }

    fn chunk_sql(&self) -> Option<settled_engine::ChunkSql> {
        Some(settled_engine::ChunkSql {
            effects: "effects AS (
                INSERT INTO jobs.sql_effects (day, item, fence, run)
                SELECT s.day, s.item, s.attempt, r.id FROM settled s CROSS JOIN run r
                RETURNING item)"
                .into(),
            held: Some("SELECT h.item AS key FROM jobs.holds h WHERE h.item IN (SELECT item FROM picked)".into()),
        })
    }
}
