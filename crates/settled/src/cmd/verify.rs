//! `settled verify`.

use std::time::Duration;

use crate::cmd::{exit_code, DbCommand, Outcome};
use crate::db::{Access, Database};
use crate::period::Period;

/// Prove from committed state that a period was paid exactly once and
/// money is conserved; exit 1 and list offenders otherwise.
///
/// Checks: a policy exists; the items are those seed and import wrote (no
/// volume changed since); no work left; every settled creator has one
/// ledger row; no ledger row lacks its settled item; every amount follows
/// the policy; the ledger total equals the expected total; every balance
/// equals its ledger total.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long, required_unless_present = "archive", conflicts_with = "archive")]
    period: Option<Period>,
    /// Re-check an archive file written by `settled archive` (the .csv or
    /// its .manifest.json): its SHA-256, row count and total against its
    /// manifest and this database's record, and every row well-formed.
    #[arg(long, value_name = "FILE")]
    archive: Option<std::path::PathBuf>,
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
    const ACCESS: Access = Access::Reads;

    async fn run(self, db: &Database) -> Outcome {
        let mut conn = db.pool.acquire().await?;
        if let Some(file) = &self.archive {
            let report = crate::archive::verify_archive(&mut conn, file).await?;
            if self.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            return Ok(exit_code(report.ok));
        }
        let period = self.period.expect("clap requires --period without --archive");
        drop(conn);
        let mut report = crate::verify::verify_pool(&db.pool, period).await?;
        let mut conn = db.pool.acquire().await?;
        if let Some(url) = self.provider_url {
            let provider = crate::provider::HttpProvider::new(&url, Duration::from_secs(60))?;
            crate::verify::reconcile_provider(&mut conn, period, &provider, &mut report).await?;
        }
        if self.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.render());
        }
        Ok(exit_code(report.ok))
    }
}
