//! One settled worker process of a continuous case (`settled
//! bench-queue-worker`, hidden): serves the bench's queue with the engine's
//! own `serve` or `serve_leased` and the workload's handler, says `ready`,
//! and serves until a line (or the end) on stdin; then stops as the engine
//! stops (work in hand finishes) and prints one JSON line of its counters.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use settled_engine::continuous::serve::Retention;
use settled_engine::{LeaseConfig, ServeConfig, ServeStats};
use sqlx::postgres::PgPoolOptions;

use super::workload::{queue, LeasedWork, TxWork};

/// How settled serves the queue.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum ServeMode {
    /// In-transaction: the effect commits with the job's completion.
    Tx,
    /// Leased: the work and the receiver's call outside any transaction,
    /// then a fenced completion.
    Leased,
}

impl ServeMode {
    /// The system's name in reports.
    pub fn system(self) -> &'static str {
        match self {
            ServeMode::Tx => "settled-tx",
            ServeMode::Leased => "settled-leased",
        }
    }
}

/// The flags `settled bench` passes to each worker process.
#[derive(Debug, Clone, clap::Args)]
pub struct QueueWorkerArgs {
    /// In-transaction or leased.
    #[arg(long, value_enum)]
    pub mode: ServeMode,
    /// Claim loops (jobs in flight) of this process.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Jobs per claim.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub batch: u32,
    /// Each job's work (a sleep), ms.
    #[arg(long, default_value_t = 1)]
    pub work_ms: u64,
    /// How long settled jobs stay before the engine's retention removes them.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_secs: u64,
}

/// What one worker process did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct QueueWorkerReport {
    /// Jobs claimed.
    pub claimed: u64,
    /// Jobs settled.
    pub settled: u64,
    /// Completions the fence refused.
    pub fence_rejections: u64,
    /// Expired leases rescued.
    pub rescued: u64,
    /// Finished jobs removed by retention.
    pub pruned: u64,
}

/// The engine's config for one worker process.
pub fn serve_config(concurrency: u32, batch: u32, retention: Duration) -> ServeConfig {
    ServeConfig {
        concurrency,
        batch,
        retention: Some(Retention {
            finished: retention,
            ..Retention::default()
        }),
        lease: LeaseConfig {
            // At most `concurrency` jobs worked at once, as in tx mode.
            calls_in_flight: concurrency as usize,
            ..LeaseConfig::default()
        },
        ..ServeConfig::default()
    }
}

/// Serves until told to stop on stdin; returns the process's counters.
pub async fn run_queue_worker(url: &str, args: QueueWorkerArgs) -> anyhow::Result<QueueWorkerReport> {
    let pool = PgPoolOptions::new()
        .max_connections(2 * args.concurrency + 4)
        .connect(url)
        .await?;
    let work = Duration::from_millis(args.work_ms);
    let cfg = serve_config(args.concurrency, args.batch, Duration::from_secs(args.retention_secs));
    let stats = Arc::new(ServeStats::default());
    let queue = Arc::new(queue());
    queue.check_table(&mut *pool.acquire().await?).await?;
    let serving = {
        let (pool, stats) = (pool.clone(), stats.clone());
        tokio::spawn(async move {
            match args.mode {
                ServeMode::Tx => settled_engine::serve(&pool, queue, Arc::new(TxWork { work }), cfg, stats).await,
                ServeMode::Leased => {
                    let handler = Arc::new(LeasedWork {
                        work,
                        pool: pool.clone(),
                    });
                    settled_engine::serve_leased(&pool, queue, handler, cfg, stats).await
                }
            }
        })
    };
    println!("ready");
    // Any line, or the end of stdin, is the stop.
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)
    })
    .await??;
    stats.request_stop();
    serving.await??;
    pool.close().await;
    Ok(QueueWorkerReport {
        claimed: stats.claimed.load(Ordering::Relaxed),
        settled: stats.settled.load(Ordering::Relaxed),
        fence_rejections: stats.fence_rejections.load(Ordering::Relaxed),
        rescued: stats.rescued.load(Ordering::Relaxed),
        pruned: stats.pruned.load(Ordering::Relaxed),
    })
}
