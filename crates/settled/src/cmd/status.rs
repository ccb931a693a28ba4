//! `settled status`.

use crate::cmd::{Outcome, ReadOnly};
use crate::db::Database;
use crate::period::Period;

/// Show exact counts by status and amounts paid for a period.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long)]
    period: Period,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Decimals of the token, for amounts shown in tokens next to base units.
    #[arg(long, env = "SETTLED_TOKEN_DECIMALS", default_value_t = crate::money::DEFAULT_DECIMALS,
          value_parser = clap::value_parser!(u32).range(0..=crate::money::MAX_DECIMALS as i64))]
    token_decimals: u32,
}

impl ReadOnly for Args {
    async fn read(self, db: &Database) -> Outcome {
        let mut conn = db.pool.acquire().await?;
        let status = crate::status::period_status(&mut conn, self.period).await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&status)?);
        } else {
            print!("{}", status.render(self.token_decimals));
        }
        Ok(std::process::ExitCode::SUCCESS)
    }
}
