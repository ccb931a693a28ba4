//! `settled demo`.

use crate::cmd::{exit_code, DbCommand, Outcome};
use crate::db::Database;
use crate::money::FeeBps;
use crate::settlement::DEFAULT_FEE_BPS;

/// Claim loops per demo worker process. The demo's worker processes share
/// one machine with their PostgreSQL: one loop each with large chunks
/// measured fastest there (docs/benchmarks.md, "The demo at a million").
pub(crate) const DEMO_CONCURRENCY: u32 = 1;
/// Creators per claim in the demo (see [`DEMO_CONCURRENCY`]).
pub(crate) const DEMO_CHUNK: u32 = 5000;

/// Seed a period, settle it with several worker processes, verify, summarize.
///
/// Each demo settles a fresh period (the day before the earliest one seeded),
/// or resumes an interrupted one. Exit 0 only if verification holds.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Creators to seed.
    #[arg(long, default_value_t = 100_000)]
    creators: u64,
    /// Worker OS processes to start.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Claim loops per worker process, 1..=256.
    #[arg(long, default_value_t = DEMO_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256))]
    concurrency: u32,
    /// Creators per claim, 1..=10000.
    #[arg(long, default_value_t = DEMO_CHUNK, value_parser = clap::value_parser!(u32).range(1..=10000))]
    chunk: u32,
    /// Seed of the synthetic data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The period's fee in basis points.
    #[arg(long, default_value_t = DEFAULT_FEE_BPS)]
    fee_bps: u32,
    /// Seed a few volumes near 2^256 - 1 instead of realistic ones.
    #[arg(long)]
    extreme_volumes: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let opts = crate::demo::DemoOptions {
            creators: self.creators,
            workers: self.workers,
            concurrency: self.concurrency,
            chunk: self.chunk,
            seed: self.seed,
            fee: FeeBps::new(self.fee_bps).map_err(anyhow::Error::msg)?,
            volumes: crate::cmd::seed::volumes(self.extreme_volumes),
        };
        match db.private_server() {
            Some(server) => eprintln!(
                "using the private PostgreSQL in {} (socket {}, port {})",
                server.pgdata().display(),
                server.socket_dir().display(),
                server.port()
            ),
            None => eprintln!("using DATABASE_URL {}", crate::db::redact_url(&db.url)),
        }
        let (summary, report) = crate::demo::demo(&db.pool, &db.url, &opts).await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else {
            print!("{}", report.render());
            print!("{}", summary.render());
        }
        Ok(exit_code(summary.verified))
    }
}
