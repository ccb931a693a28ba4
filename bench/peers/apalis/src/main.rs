//! apalis with apalis-postgres doing settled's per-creator work (see
//! ../README.md). W workers, each its own `WorkerBuilder` over its own
//! `PostgresStorage`, each running one job at a time.
//! defaults: `Config::default()` (batch_size 10).
//! tuned: `batch_size(100)`.

#[path = "../../batch.rs"]
mod batch;

use std::time::Instant;

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

#[tokio::main]
async fn main() -> Result<(), BoxDynError> {
    let case = batch::Case::from_env()?;
    let (workers, tuned) = (case.workers, case.tuned);

    let pool = PgPoolOptions::new()
        .max_connections(2 * workers + 4)
        .connect(&case.url)
        .await?;
    PostgresStorage::setup(&pool).await?;
    let creators = case.creators(&pool).await?;
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
        period: case.period,
        run_id: case.run_id,
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
    let remaining = case.wait_settled(&pool, started).await?;
    let drained = started.elapsed() - enqueued;
    for r in &running {
        r.abort();
    }
    let settings = if tuned {
        format!("{workers} workers, batch_size 100, push_bulk in batches of 5000")
    } else {
        format!("{workers} workers, Config::default() (batch_size 10), push_bulk in batches of 5000")
    };
    let version = std::env::var("APALIS_VERSION").unwrap_or_else(|_| "1.0".into());
    let settled = creators.len() as i64 - remaining;
    batch::report(enqueued, drained, settled, &version, &settings);
    std::process::exit(0);
}
