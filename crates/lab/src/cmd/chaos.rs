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
///
/// With --payouts: a payout storm instead. --servers `settled serve`
/// processes take --requests payout requests from --clients concurrent
/// clients (keys repeated, confirmations raced against each other and
/// against cancels, some left to expire); --workers `settled deliver`
/// processes pay them through the provider simulator (failures, refusals,
/// webhooks duplicated, held back and lost), SIGKILLed and SIGSTOPped past
/// their leases, their connections terminated, PostgreSQL restarted once,
/// the provider answering 503s, 429s and late applies. After the drain:
/// every payout paid once at the provider or returned once, none stuck,
/// verify holds; the report counts payouts, provider applications,
/// duplicates absorbed by keys, returns and conflicts.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Creators to settle [default: 20000; --payouts: a tenth of --requests].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    creators: Option<u64>,
    /// Worker processes (--payouts: `settled deliver` processes).
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// A payout storm through `settled serve` and `settled deliver`
    /// instead of a settlement.
    #[arg(long)]
    payouts: bool,
    /// --payouts: payout requests (distinct idempotency keys).
    #[arg(long, default_value_t = 2_000, requires = "payouts")]
    requests: u64,
    /// --payouts: concurrent clients.
    #[arg(long, default_value_t = 32, requires = "payouts")]
    clients: u32,
    /// --payouts: `settled serve` processes.
    #[arg(long, default_value_t = 2, requires = "payouts")]
    servers: u32,
    /// Length of the fault schedule in seconds (the work is spread over it).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Seed of the schedule; the same seed replays the same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker mode (not with --payouts).
    #[arg(long, value_enum, default_value_t = Mode::Leased, conflicts_with = "payouts")]
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
            let report = if self.payouts {
                crate::chaos::chaos_payouts(crate::chaos::PayoutChaosOptions {
                    creators: self.creators.unwrap_or((self.requests / 10).max(1)),
                    requests: self.requests,
                    clients: self.clients,
                    servers: self.servers,
                    deliverers: self.workers,
                    duration: self.duration,
                    seed: self.seed,
                    lease_ttl_ms: self.lease_ttl_ms,
                    database_url: global.database_url(),
                })
                .await?
            } else {
                crate::chaos::chaos(crate::chaos::ChaosOptions {
                    creators: self.creators.unwrap_or(20_000),
                    workers: self.workers,
                    duration: self.duration,
                    seed: self.seed,
                    mode: self.mode,
                    concurrency: self.concurrency,
                    chunk: self.chunk,
                    lease_ttl_ms: self.lease_ttl_ms,
                    database_url: global.database_url(),
                })
                .await?
            };
            if self.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(exit_code(report.ok))
        })
    }
}
