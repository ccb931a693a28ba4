//! `settled policy`.

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::money::FeeBps;
use crate::period::Period;

/// Set a period's fee policy: reward = floor(volume * fee_bps / 10000).
///
/// Refused once a run for the period has started.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long)]
    period: Period,
    /// Fee in basis points, 0..=10000.
    #[arg(long)]
    fee_bps: u32,
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let fee = FeeBps::new(self.fee_bps).map_err(anyhow::Error::msg)?;
        crate::settlement::set_policy(&db.pool, self.period, fee).await?;
        println!("policy of {}: fee {fee} bps", self.period);
        Ok(std::process::ExitCode::SUCCESS)
    }
}
