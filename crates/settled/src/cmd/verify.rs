//! `settled verify`.

use std::time::Duration;

use crate::cmd::{exit_code, DbCommand, Outcome};
use crate::db::Database;
use crate::period::Period;

/// Prove from committed state that a period was paid exactly once and
/// money is conserved; exit 1 and list offenders otherwise.
///
/// Checks: a policy exists; no work left; every settled creator has one
/// ledger row; no ledger row lacks its settled item; every amount follows
/// the policy; the ledger total equals the expected total; every balance
/// equals its ledger total.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long)]
    period: Period,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Also reconcile with this payment provider: one payment per paid
    /// creator, same amount, none for anyone unpaid.
    #[arg(long)]
    provider_url: Option<String>,
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_readonly");

    async fn run(self, db: &Database) -> Outcome {
        let mut conn = db.pool.acquire().await?;
        let mut report = crate::verify::verify(&mut conn, self.period).await?;
        if let Some(url) = self.provider_url {
            let provider = crate::provider::HttpProvider::new(&url, Duration::from_secs(60))?;
            crate::verify::reconcile_provider(&mut conn, self.period, &provider, &mut report).await?;
        }
        if self.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.render());
        }
        Ok(exit_code(report.ok))
    }
}
