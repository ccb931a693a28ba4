//! `settled retry`.

use crate::address::CreatorAddress;
use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::period::Period;

/// Put a period's failed items back to eligible (all, or one creator's).
///
/// Their attempts so far stop counting toward --max-attempts; their
/// attempt numbers (fences) keep growing, so no old claim can complete them.
/// A finished run is reopened so workers settle what came back.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long)]
    period: Period,
    /// Only this creator (0x + 40 hex digits).
    #[arg(long)]
    creator: Option<String>,
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let creator = self.creator.map(|c| CreatorAddress::parse(&c)).transpose()?;
        let mut tx = db.pool.begin().await?;
        let n = crate::settlement::retry_failed(&mut tx, self.period, creator.as_ref()).await?;
        let target = match &creator {
            Some(c) => format!("period {} creator {c}", self.period),
            None => format!("period {}", self.period),
        };
        let outcome = format!("{} {n} item(s) retried", crate::audit::OK);
        crate::audit::record_cli(&mut tx, "retry", &target, &outcome).await?;
        tx.commit().await?;
        println!("{n} failed item(s) of {} put back to eligible", self.period);
        Ok(std::process::ExitCode::SUCCESS)
    }
}
