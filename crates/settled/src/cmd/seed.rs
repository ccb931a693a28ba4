//! `settled seed`.

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::money::FeeBps;
use crate::period::Period;
use crate::progress::Progress;

/// Create deterministic synthetic trade volumes for a period.
///
/// Creators get valid EVM addresses (the same creators for the same seed in
/// every period); volumes are skewed, with some zeros and a few near 2^256.
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
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let fee = self.fee_bps.map(FeeBps::new).transpose().map_err(anyhow::Error::msg)?;
        let bar = Progress::new("seed", self.creators);
        let outcome = crate::seed::seed(&db.pool, self.period, self.creators, self.seed, fee, &bar).await?;
        println!(
            "seeded period {}: {} creators inserted, {} already present, fee {} bps",
            self.period, outcome.inserted, outcome.already_present, outcome.fee_bps
        );
        Ok(std::process::ExitCode::SUCCESS)
    }
}
