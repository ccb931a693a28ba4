//! What the Rust peers' batch binaries (`src/main.rs`) share (see
//! README.md), included by each with `#[path]`: the case in the
//! environment, the period's creators, the wait until none of them is left
//! unsettled, and the JSON line the bench reads. The peer's own enqueue
//! and workers stay in its `main.rs`.

use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The case, from the environment.
pub struct Case {
    pub url: String,
    pub period: chrono::NaiveDate,
    pub run_id: i64,
    pub workers: u32,
    pub tuned: bool,
    pub limit: Duration,
}

/// A variable of the case; unset, an error that names it.
fn env(key: &str) -> Result<String, BoxError> {
    std::env::var(key).map_err(|_| format!("{key} is not set").into())
}

impl Case {
    pub fn from_env() -> Result<Case, BoxError> {
        Ok(Case {
            url: env("BENCH_DATABASE_URL")?,
            period: env("BENCH_PERIOD")?.parse()?,
            run_id: env("BENCH_RUN_ID")?.parse()?,
            workers: env("BENCH_WORKERS")?.parse()?,
            tuned: env("BENCH_CONFIG")? == "tuned",
            limit: Duration::from_secs_f64(env("BENCH_TIME_LIMIT_SECONDS")?.parse()?),
        })
    }

    /// The period's creators, in order: one job each.
    pub async fn creators(&self, pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT creator FROM settlement.token_trade_volume WHERE period = $1 ORDER BY creator")
            .bind(self.period)
            .fetch_all(pool)
            .await
    }

    /// Polls until no creator of the period is left unsettled or the time
    /// limit (from `started`) is up; returns how many are left.
    pub async fn wait_settled(&self, pool: &PgPool, started: Instant) -> Result<i64, sqlx::Error> {
        let mut remaining = self.unsettled(pool).await?;
        while remaining > 0 && started.elapsed() < self.limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
            remaining = self.unsettled(pool).await?;
        }
        Ok(remaining)
    }

    async fn unsettled(&self, pool: &PgPool) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT count(*) FROM settlement.token_trade_volume WHERE period = $1 AND status <> 'settled'",
        )
        .bind(self.period)
        .fetch_one(pool)
        .await
    }
}

/// The one line the bench reads.
pub fn report(enqueued: Duration, drained: Duration, settled: i64, version: &str, settings: &str) {
    println!(
        "{}",
        serde_json::json!({
            "enqueue_seconds": enqueued.as_secs_f64(),
            "drain_seconds": drained.as_secs_f64(),
            "settled": settled,
            "version": version,
            "settings": settings,
        })
    );
}
