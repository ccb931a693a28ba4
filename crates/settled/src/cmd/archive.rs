//! `settled archive`.

use std::path::PathBuf;

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;

/// Retire settled periods before a date from the hot tables, all or nothing.
///
/// Each period's ledger partition is exported (COPY, creator order) to
/// DIR/ledger-YYYY-MM-DD.csv with a manifest (rows, total, SHA-256), read
/// back and compared with the database, its creators' totals carried into
/// settlement.ledger_carry, and then detached (kept in settlement_archive,
/// or dropped with --drop-ledger); its work-table partition is dropped.
/// Refused (nothing archived) if any period before the date has a run that
/// is not finished or an item that is not settled. Re-check a file with
/// `settled verify --archive FILE`.
///
/// When COMMIT gets no answer (a lost connection), a new connection learns
/// whether the archive committed: if so, the files stay and a line on
/// stderr says so; if it certainly did not, the files are removed and the
/// command fails; if that cannot be learned, the files stay and the command
/// fails saying the outcome is unknown and which files to check.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Archive periods strictly before this date (YYYY-MM-DD).
    #[arg(long)]
    before: chrono::NaiveDate,
    /// Directory for the archive files (created if missing).
    #[arg(long, default_value = "archive")]
    dir: PathBuf,
    /// Drop each detached ledger partition once its file is written and
    /// checked, instead of keeping it in the settlement_archive schema.
    #[arg(long)]
    drop_ledger: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let opts = crate::archive::ArchiveOptions {
            before: self.before,
            dir: self.dir,
            drop_ledger: self.drop_ledger,
            actor: None,
        };
        let done = crate::archive::archive(&db.pool, &opts).await?;
        let archived = &done.archived;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&archived)?);
        } else if archived.is_empty() {
            println!("nothing to archive before {}", opts.before);
        } else {
            for a in archived {
                println!(
                    "archived {}: {} ledger rows, total {}, sha256 {} -> {}{}",
                    a.manifest.period,
                    a.manifest.rows,
                    a.manifest.total,
                    a.manifest.sha256,
                    a.path.display(),
                    a.kept_as
                        .as_deref()
                        .map(|k| format!(" (ledger rows kept as {k})"))
                        .unwrap_or_default()
                );
            }
        }
        if done.committed_unanswered {
            eprintln!(
                "the answer to COMMIT was lost; a new connection found the archive committed (settlement.archived_periods names the periods above)"
            );
        }
        Ok(std::process::ExitCode::SUCCESS)
    }
}
