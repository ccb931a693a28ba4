//! apalis with apalis-postgres on the continuous workload (see
//! ../../../README.md): W workers, each its own `WorkerBuilder` over its
//! own `PostgresStorage` with `Config::default()` and its LISTEN/NOTIFY
//! listener (`with_pubsub`), each running one job at a time; `push` per
//! job, `push_bulk` for bulk. Each job sleeps and writes one effect row.

#[path = "../../../continuous.rs"]
mod continuous;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use apalis_postgres::PostgresStorage;
use continuous::{Case, Peer};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct BenchJob {
    job: String,
    enq_us: i64,
}

#[derive(Clone)]
struct Shared {
    pool: PgPool,
    work: Duration,
}

async fn handle(job: BenchJob, shared: Data<Shared>) -> Result<(), BoxDynError> {
    let started_us = continuous::now_us();
    continuous::STARTED.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(shared.work).await;
    sqlx::query("INSERT INTO bench.effects (job, enq_us, started_us) VALUES ($1, $2, $3)")
        .bind(&job.job)
        .bind(job.enq_us)
        .bind(started_us)
        .execute(&shared.pool)
        .await?;
    Ok(())
}

struct Apalis {
    sink: PostgresStorage<BenchJob>,
}

impl Peer for Apalis {
    async fn one(&self, (job, enq_us): (String, i64)) -> Result<(), continuous::BoxError> {
        let mut sink = self.sink.clone();
        sink.push(BenchJob { job, enq_us }).await?;
        Ok(())
    }

    async fn many(&self, jobs: Vec<(String, i64)>) -> Result<(), continuous::BoxError> {
        let mut sink = self.sink.clone();
        sink.push_bulk(jobs.into_iter().map(|(job, enq_us)| BenchJob { job, enq_us }).collect())
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), continuous::BoxError> {
    let case = Case::from_env();
    let pool = PgPoolOptions::new()
        .max_connections(2 * case.workers + 12)
        .connect(&case.url)
        .await?;
    PostgresStorage::setup(&pool).await?;
    let shared = Shared {
        pool: pool.clone(),
        work: case.work,
    };
    let mut running = Vec::new();
    for i in 0..case.workers {
        // LISTEN/NOTIFY: the polling storage alone never fetched jobs
        // pushed after its worker started.
        let backend = PostgresStorage::<BenchJob>::new(&pool).with_pubsub();
        let worker = WorkerBuilder::new(format!("bench-{i}"))
            .backend(backend)
            .data(shared.clone())
            .build(handle);
        running.push(tokio::spawn(async move {
            if let Err(e) = worker.run().await {
                eprintln!("apalis worker stopped: {e}");
            }
        }));
    }
    // The producer's calls on a pool of their own, so they never take the
    // workers' connections.
    let producer_pool = PgPoolOptions::new().max_connections(8).connect(&case.url).await?;
    let peer = Arc::new(Apalis {
        sink: PostgresStorage::new(&producer_pool),
    });
    continuous::drive(peer, &case).await?;
    // Let the jobs in hand finish their effect rows before the workers go.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for r in &running {
        r.abort();
    }
    let version = std::env::var("APALIS_VERSION").unwrap_or_else(|_| "apalis 1.0".into());
    let settings = format!(
        "{} workers, Config::default() with_pubsub() (LISTEN/NOTIFY), one job at a time each; push() per job, push_bulk() for bulk",
        case.workers
    );
    continuous::report(&version, &settings);
    std::process::exit(0);
}
