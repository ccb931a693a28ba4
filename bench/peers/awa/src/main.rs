//! awa 0.6 doing settled's per-creator work (see ../README.md): one awa
//! `Client` on its default engine (queue storage, activated by the first
//! `start` on a fresh database), one job per creator, each running
//! `settle_one.sql`.
//! defaults: `QueueConfig { max_workers: W, ..QueueConfig::default() }`
//! (poll 200 ms, one claimer, claim batches of up to 512).
//! tuned: as awa's own throughput benchmark: two claimers, poll 50 ms, no
//! deadline rescue, enqueued with COPY.

#[path = "../../batch.rs"]
mod batch;

use std::time::{Duration, Instant};

use awa::{InsertOpts, JobArgs, JobContext, JobError, JobResult, QueueConfig, QueueStorage, QueueStorageConfig};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

const SETTLE: &str = include_str!("../../settle_one.sql");
const QUEUE: &str = "settle";

#[derive(Debug, Clone, Serialize, Deserialize, JobArgs)]
struct Settle {
    creator: String,
}

#[tokio::main]
async fn main() -> Result<(), batch::BoxError> {
    let case = batch::Case::from_env()?;
    let (period, run_id, workers, tuned) = (case.period, case.run_id, case.workers, case.tuned);

    let pool = PgPoolOptions::new()
        .max_connections(workers + 10)
        .connect(&case.url)
        .await?;
    awa::migrations::run(&pool).await?;
    let creators = case.creators(&pool).await?;

    let queue = if tuned {
        QueueConfig {
            max_workers: workers,
            claimers: 2,
            poll_interval: Duration::from_millis(50),
            deadline_duration: Duration::ZERO,
            ..QueueConfig::default()
        }
    } else {
        QueueConfig {
            max_workers: workers,
            ..QueueConfig::default()
        }
    };
    let work_pool = pool.clone();
    let client = awa::Client::builder(pool.clone())
        .queue(QUEUE, queue)
        .register::<Settle, _, _>(move |job: Settle, _ctx: &JobContext| {
            let pool = work_pool.clone();
            async move {
                sqlx::query(SETTLE)
                    .bind(period)
                    .bind(&job.creator)
                    .bind(run_id)
                    .execute(&pool)
                    .await
                    .map_err(|e| JobError::retryable(e))?;
                Ok(JobResult::Completed)
            }
        })
        .build()?;
    // Not timed: the first start on a fresh database installs and activates
    // awa's queue storage.
    client.start().await?;
    let store = QueueStorage::new(QueueStorageConfig::default())?;

    let started = Instant::now();
    // Batches of 2,000: a batch insert binds 18 parameters per job, and a
    // statement takes at most 65,535.
    for part in creators.chunks(2000) {
        let params = part
            .iter()
            .map(|c| {
                awa::model::insert::params_with(
                    &Settle { creator: c.clone() },
                    InsertOpts {
                        queue: QUEUE.into(),
                        ..Default::default()
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        if tuned {
            store.enqueue_params_copy(&pool, &params).await?;
        } else {
            store.enqueue_params_batch(&pool, &params).await?;
        }
    }
    let enqueued = started.elapsed();

    let remaining = case.wait_settled(&pool, started).await?;
    let drained = started.elapsed() - enqueued;
    client.shutdown(Duration::from_secs(5)).await;
    let settings = if tuned {
        format!("max_workers {workers}, claimers 2, poll 50 ms, no deadline rescue, enqueued with COPY in batches of 2000")
    } else {
        format!("max_workers {workers}, QueueConfig::default() otherwise, enqueued in batches of 2000")
    };
    let version = std::env::var("AWA_VERSION").unwrap_or_else(|_| "0.6".into());
    let settled = creators.len() as i64 - remaining;
    batch::report(enqueued, drained, settled, &version, &settings);
    std::process::exit(0);
}
