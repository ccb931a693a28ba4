//! `settled lab`: the lab's tools that face the outside; today
//! `settled lab harness-adapter`.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use settled::cmd::{Global, Outcome, Runnable};

use crate::bench::continuous::ServeMode;

/// Lab tools that speak other projects' protocols.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Debug, clap::Subcommand)]
enum LabCommand {
    HarnessAdapter(HarnessAdapterArgs),
}

/// Settled's engine as an adapter of the public PostgreSQL job-queue
/// benchmark (its long-horizon runner's contract).
///
/// Reads DATABASE_URL, SCENARIO (long_horizon), PRODUCER_MODE (fixed or
/// depth-target), PRODUCER_RATE, PRODUCER_PACING (harness: one bulk enqueue
/// per `ENQUEUE n` line on stdin; adapter: its own clock), PRODUCER_BATCH_MAX,
/// PRODUCER_BATCH_MS, TARGET_DEPTH, WORKER_COUNT (claim loops),
/// JOB_PAYLOAD_BYTES, JOB_WORK_MS, SAMPLE_EVERY_S, LATENCY_WINDOW_MS,
/// BENCH_INSTANCE_ID and SETTLED_BATCH (jobs per claim, default 10 in tx mode and 50 leased). Installs
/// the engine and the queue `harness` on settled_harness.jobs, then writes
/// JSONL to stdout: a descriptor, then every SAMPLE_EVERY_S claim_p50_ms,
/// claim_p95_ms, claim_p99_ms (the engine's pickup latency over
/// LATENCY_WINDOW_MS), enqueue_rate, completion_rate and queue_depth. Logs
/// go to stderr. SIGTERM or SIGINT: exit 0 within 5 s.
#[derive(Debug, clap::Args)]
struct HarnessAdapterArgs {
    /// tx (the work and completion in one transaction) or leased.
    #[arg(long, value_enum, env = "SETTLED_MODE", default_value = "tx")]
    mode: ServeMode,
}

impl Runnable for Args {
    fn run(self: Box<Self>, _global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            match self.command {
                LabCommand::HarnessAdapter(args) => crate::harness::run(args.mode).await?,
            }
            Ok(ExitCode::SUCCESS)
        })
    }
}
