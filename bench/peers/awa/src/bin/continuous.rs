//! awa 0.6 on the continuous workload (see ../../../README.md): one awa
//! `Client` on its queue storage engine, installed and given to the
//! builder as awa's own benchmark does (without `queue_storage(..)` on the
//! builder, jobs enqueued while the client ran stopped being claimed after
//! the first second), rotation intervals 1 s and 50 ms, `max_workers` W,
//! poll and claimers as shipped; `insert_with` per job,
//! `enqueue_params_batch` for bulk. Each job sleeps and writes one effect
//! row.

#[path = "../../../continuous.rs"]
mod continuous;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use awa::{InsertOpts, JobArgs, JobContext, JobError, JobResult, QueueConfig, QueueStorage, QueueStorageConfig};
use continuous::{BoxError, Case, Peer};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};

const QUEUE: &str = "bench";

#[derive(Debug, Clone, Serialize, Deserialize, JobArgs)]
struct BenchJob {
    job: String,
    enq_us: i64,
}

struct Awa {
    pool: PgPool,
    store: QueueStorage,
}

fn opts() -> InsertOpts {
    InsertOpts {
        queue: QUEUE.into(),
        ..Default::default()
    }
}

impl Peer for Awa {
    async fn one(&self, (job, enq_us): (String, i64)) -> Result<(), BoxError> {
        awa::model::insert::insert_with(&self.pool, &BenchJob { job, enq_us }, opts()).await?;
        Ok(())
    }

    async fn many(&self, jobs: Vec<(String, i64)>) -> Result<(), BoxError> {
        let params = jobs
            .into_iter()
            .map(|(job, enq_us)| awa::model::insert::params_with(&BenchJob { job, enq_us }, opts()))
            .collect::<Result<Vec<_>, _>>()?;
        self.store.enqueue_params_batch(&self.pool, &params).await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let case = Case::from_env();
    let pool = PgPoolOptions::new()
        .max_connections(case.workers + 16)
        .connect(&case.url)
        .await?;
    awa::migrations::run(&pool).await?;
    QueueStorage::new(QueueStorageConfig::default())?.install(&pool).await?;
    // The handlers' effect rows and the producer use pools of their own.
    let effects = PgPoolOptions::new().max_connections(case.workers + 2).connect(&case.url).await?;
    let (work_pool, work) = (effects, case.work);
    let client = awa::Client::builder(pool.clone())
        .queue(
            QUEUE,
            QueueConfig {
                max_workers: case.workers,
                ..QueueConfig::default()
            },
        )
        .register::<BenchJob, _, _>(move |job: BenchJob, _ctx: &JobContext| {
            let pool = work_pool.clone();
            async move {
                let started_us = continuous::now_us();
                continuous::STARTED.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(work).await;
                sqlx::query("INSERT INTO bench.effects (job, enq_us, started_us) VALUES ($1, $2, $3)")
                    .bind(&job.job)
                    .bind(job.enq_us)
                    .bind(started_us)
                    .execute(&pool)
                    .await
                    .map_err(JobError::retryable)?;
                Ok(JobResult::Completed)
            }
        })
        .queue_storage(QueueStorageConfig::default(), Duration::from_millis(1000), Duration::from_millis(50))
        .build()?;
    client.start().await?;
    let peer = Arc::new(Awa {
        pool: PgPoolOptions::new().max_connections(8).connect(&case.url).await?,
        store: QueueStorage::new(QueueStorageConfig::default())?,
    });
    continuous::drive(peer, &case).await?;
    client.shutdown(Duration::from_secs(10)).await;
    let version = std::env::var("AWA_VERSION").unwrap_or_else(|_| "awa 0.6".into());
    let settings = format!(
        "max_workers {}, QueueConfig::default() otherwise, queue storage (rotate 1 s / 50 ms); insert_with() per job, enqueue_params_batch() for bulk",
        case.workers
    );
    continuous::report(&version, &settings);
    std::process::exit(0);
}
