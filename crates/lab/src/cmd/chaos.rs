//! `settled chaos`.

use std::future::Future;
use std::pin::Pin;

use settled::cmd::{exit_code, Global, Outcome, Runnable};
use settled::worker::Mode;

/// Settle a period while injecting faults, then prove nothing was paid
/// twice or lost.
///
/// On a fresh database of its own (a throwaway private PostgreSQL, or a new
/// database on DATABASE_URL's server), it runs --workers worker processes
/// and injects, from a schedule seeded by --seed: SIGKILL of a worker (then
/// a new one), SIGSTOP of a worker past its lease then SIGCONT (a zombie),
/// pg_terminate_backend on worker connections, a PostgreSQL restart (when
/// it runs the server), and in leased mode provider errors and "applied,
/// then timed out". Then it checks every invariant. Exit 0 only if all hold.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Creators to settle.
    #[arg(long, default_value_t = 20_000)]
    creators: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Length of the fault schedule in seconds (the work is spread over it).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Seed of the schedule; the same seed replays the same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker mode.
    #[arg(long, value_enum, default_value_t = Mode::Leased)]
    mode: Mode,
    /// Claim loops per worker.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    concurrency: u32,
    /// Creators per claim.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10000))]
    chunk: u32,
    /// Lease ttl in milliseconds (short, so zombies and rescues happen often).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(300..=600_000))]
    lease_ttl_ms: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

impl Runnable for Args {
    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            let report = crate::chaos::chaos(crate::chaos::ChaosOptions {
                creators: self.creators,
                workers: self.workers,
                duration: self.duration,
                seed: self.seed,
                mode: self.mode,
                concurrency: self.concurrency,
                chunk: self.chunk,
                lease_ttl_ms: self.lease_ttl_ms,
                database_url: global.database_url(),
            })
            .await?;
            if self.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(exit_code(report.ok))
        })
    }
}
