//! `settled seed`.

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::money::FeeBps;
use crate::period::Period;
use crate::progress::Progress;

/// Create deterministic synthetic trade volumes for a period.
///
/// Creators get valid EVM addresses (the same creators for the same seed in
/// every period); volumes are realistic trade volumes (some zeros, most
/// 0.001 to 1,000,000 tokens, a few whales), or with --extreme-volumes
/// reach 2^256 - 1.
/// The period's rows are written in key order, as `settled import` writes
/// them. Refused once the period has a run. Re-running with the same
/// arguments adds nothing.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long)]
    period: Period,
    /// How many creators.
    #[arg(long)]
    creators: u64,
    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also set the period's fee (basis points, 0..=10000). Without it, a
    /// period with no policy gets the default of 250.
    #[arg(long)]
    fee_bps: Option<u32>,
    /// Seed a few volumes near 2^256 - 1, the largest amount there is,
    /// instead of realistic trade volumes (0.001 to 1,000,000 tokens, a few
    /// whales): for tests of range.
    #[arg(long)]
    extreme_volumes: bool,
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let fee = self.fee_bps.map(FeeBps::new).transpose().map_err(anyhow::Error::msg)?;
        let bar = Progress::new("seed", self.creators);
        let outcome = crate::seed::seed(
            &db.pool,
            self.period,
            self.creators,
            self.seed,
            fee,
            volumes(self.extreme_volumes),
            &bar,
        )
        .await?;
        println!(
            "seeded period {}: {} creators inserted, {} already present, fee {} bps",
            self.period, outcome.inserted, outcome.already_present, outcome.fee_bps
        );
        Ok(std::process::ExitCode::SUCCESS)
    }
}

/// The volumes `--extreme-volumes` asks for.
pub(crate) fn volumes(extreme: bool) -> crate::seed::Volumes {
    if extreme {
        crate::seed::Volumes::Extreme
    } else {
        crate::seed::Volumes::Realistic
    }
}
