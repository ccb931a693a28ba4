//! `settled status`.

use crate::cmd::{DbCommand, Outcome};
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
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_readonly");

    async fn run(self, db: &Database) -> Outcome {
        let mut conn = db.pool.acquire().await?;
        let status = crate::status::period_status(&mut conn, self.period).await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&status)?);
        } else {
            print!("{}", status.render());
        }
        Ok(std::process::ExitCode::SUCCESS)
    }
}
