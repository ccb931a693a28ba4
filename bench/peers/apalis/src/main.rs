//! apalis with apalis-postgres doing settled's per-creator work (see
//! ../README.md). W workers, each its own `WorkerBuilder` over its own
//! `PostgresStorage`, each running one job at a time.
//! defaults: `Config::default()` (batch_size 10).
//! tuned: `batch_size(100)`.

use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};

const SETTLE: &str = include_str!("../../settle_one.sql");

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Settle {
    creator: String,
}

#[derive(Clone)]
struct Shared {
    pool: PgPool,
    period: chrono::NaiveDate,
    run_id: i64,
}

async fn settle(job: Settle, shared: Data<Shared>) -> Result<(), BoxDynError> {
    sqlx::query(SETTLE)
        .bind(shared.period)
        .bind(&job.creator)
        .bind(shared.run_id)
        .execute(&shared.pool)
        .await?;
    Ok(())
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is not set"))
}

#[tokio::main]
async fn main() -> Result<(), BoxDynError> {
    let url = env("BENCH_DATABASE_URL");
    let period: chrono::NaiveDate = env("BENCH_PERIOD").parse()?;
    let run_id: i64 = env("BENCH_RUN_ID").parse()?;
    let workers: u32 = env("BENCH_WORKERS").parse()?;
    let tuned = env("BENCH_CONFIG") == "tuned";
    let limit = Duration::from_secs_f64(env("BENCH_TIME_LIMIT_SECONDS").parse()?);

    let pool = PgPoolOptions::new()
        .max_connections(2 * workers + 4)
        .connect(&url)
        .await?;
    PostgresStorage::setup(&pool).await?;
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.token_trade_volume WHERE period = $1 ORDER BY creator")
            .bind(period)
            .fetch_all(&pool)
            .await?;
    let config = if tuned {
        Config::default().batch_size(100)
    } else {
        Config::default()
    };

    let started = Instant::now();
    let mut sink: PostgresStorage<Settle> = PostgresStorage::new(&pool).with_config(config.clone());
    for part in creators.chunks(5000) {
        sink.push_bulk(part.iter().map(|c| Settle { creator: c.clone() }).collect())
            .await?;
    }
    let enqueued = started.elapsed();

    let shared = Shared {
        pool: pool.clone(),
        period,
        run_id,
    };
    let mut running = Vec::new();
    for i in 0..workers {
        let backend: PostgresStorage<Settle> = PostgresStorage::new(&pool).with_config(config.clone());
        let worker = WorkerBuilder::new(format!("settle-{i}"))
            .backend(backend)
            .data(shared.clone())
            .build(settle);
        running.push(tokio::spawn(async move {
            let _ = worker.run().await;
        }));
    }
    let left = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM settlement.token_trade_volume WHERE period = $1 AND status <> 'settled'",
        )
        .bind(period)
        .fetch_one(&pool)
        .await
    };
    let mut remaining = left().await?;
    while remaining > 0 && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(20)).await;
        remaining = left().await?;
    }
    let drained = started.elapsed() - enqueued;
    for r in &running {
        r.abort();
    }
    let settings = if tuned {
        format!("{workers} workers, batch_size 100, push_bulk in batches of 5000")
    } else {
        format!("{workers} workers, Config::default() (batch_size 10), push_bulk in batches of 5000")
    };
    println!(
        "{}",
        serde_json::json!({
            "enqueue_seconds": enqueued.as_secs_f64(),
            "drain_seconds": drained.as_secs_f64(),
            "settled": creators.len() as i64 - remaining,
            "version": std::env::var("APALIS_VERSION").unwrap_or_else(|_| "1.0".into()),
            "settings": settings,
        })
    );
    std::process::exit(0);
}
