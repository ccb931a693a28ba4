//! `settled lab`: the lab's tools that face the outside:
//! `settled lab harness-adapter` and `settled lab pgbench-script`.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use settled::cmd::{Global, Outcome, Runnable};

use crate::bench::continuous::ServeMode;

/// Lab tools that speak other projects' protocols or feed their tools.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Debug, clap::Subcommand)]
enum LabCommand {
    HarnessAdapter(HarnessAdapterArgs),
    PgbenchScript(PgbenchScriptArgs),
}

/// Prints the product's chunk statement as a pgbench script (one chunk in
/// one transaction), generated from the code: what `bench/pgbench/*.sh`
/// run, so they cannot drift from the product.
///
/// Without `--range`: one chunk claimed from the start of the index, on the
/// partitioned table (any period; variables :period, :run, :chunk). With
/// `--range`: the claim of keys after :lo up to :hi on `--period`'s own
/// partition, read from the database at DATABASE_URL (variables :period,
/// :run, :chunk, :lo, :hi).
#[derive(Debug, clap::Args)]
struct PgbenchScriptArgs {
    /// The key-range form on the period's partition.
    #[arg(long, requires = "period")]
    range: bool,
    /// The period whose partition the range form names (YYYY-MM-DD).
    #[arg(long)]
    period: Option<String>,
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
    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            match self.command {
                LabCommand::HarnessAdapter(args) => crate::harness::run(args.mode).await?,
                LabCommand::PgbenchScript(args) => print!("{}", pgbench_script(&args, global.database_url()).await?),
            }
            Ok(ExitCode::SUCCESS)
        })
    }
}

async fn pgbench_script(args: &PgbenchScriptArgs, database_url: Option<String>) -> anyhow::Result<String> {
    use crate::bench::floors;
    match (args.range, &args.period) {
        (true, Some(period)) => {
            let period = settled::period::Period::parse(period).map_err(anyhow::Error::msg)?;
            let url = database_url.ok_or_else(|| anyhow::anyhow!("--range reads the partition: set DATABASE_URL"))?;
            floors::settle_range_script(&url, period).await
        }
        _ => Ok(floors::settle_chunk_script()),
    }
}
