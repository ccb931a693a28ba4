//! `settled import`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::period::Period;

/// Import trade volumes from a CSV or JSON Lines file (or `-` for stdin).
///
/// CSV: a header `period,creator,volume` (or `creator,volume` with
/// --period) and one row per line. JSONL: one object per line with
/// `period`, `creator`, `volume` (volume as a string of digits). Every line
/// is validated: creator is 0x + 40 hex digits (mixed case must pass
/// EIP-55), volume an integer 0..=2^256-1 written with digits only, period a
/// date not in the future, no duplicate (period, creator), valid UTF-8, at
/// most 4 KiB per line. All or nothing by default: any error imports
/// nothing, prints the first 50 errors and exits 1. Importing the same file
/// again changes nothing. A period whose run has started is refused; while
/// an import runs, no run of its periods can start (a run start waits for
/// it), so its rows are settled by that run.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The file, or - for standard input.
    file: PathBuf,
    /// The format (default: from the extension: .jsonl/.ndjson, else csv).
    #[arg(long, value_enum)]
    format: Option<crate::import::Format>,
    /// The period of every row (the file may then leave it out).
    #[arg(long)]
    period: Option<Period>,
    /// Import the valid rows anyway and write the rejected ones, with
    /// their line and reason, to this CSV file (refused if it is the input
    /// file itself).
    #[arg(long, value_name = "REJECTS_FILE")]
    skip_invalid: Option<PathBuf>,
    /// Write every error (not only the first 50) to this file (refused if
    /// it is the input file itself).
    #[arg(long, value_name = "FILE")]
    errors: Option<PathBuf>,
    /// Allow adding rows to a period that has rows from another import
    /// (while its run has not started).
    #[arg(long)]
    append: bool,
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let opts = crate::import::ImportOptions {
            path: self.file.clone(),
            format: self.format,
            period: self.period,
            skip_invalid: self.skip_invalid,
            errors_file: self.errors.clone(),
            append: self.append,
        };
        let started = std::time::Instant::now();
        let outcome = crate::import::import(&db.pool, &opts).await?;
        for line in &outcome.first_errors {
            eprintln!("{line}");
        }
        if outcome.errors as usize > outcome.first_errors.len() {
            let hint = if self.errors.is_some() {
                " (all of them in --errors)"
            } else {
                " (use --errors FILE to see all)"
            };
            eprintln!(
                "... and {} more{hint}",
                outcome.errors as usize - outcome.first_errors.len()
            );
        }
        if outcome.refused {
            eprintln!(
                "{}: {} error(s) in {} rows; nothing was imported",
                self.file.display(),
                outcome.errors,
                outcome.rows
            );
            return Ok(ExitCode::from(1));
        }
        println!(
            "{}: {} rows read, {} imported, {} already present, {} rejected, in {:.1} s",
            self.file.display(),
            outcome.rows,
            outcome.inserted,
            outcome.already_present,
            outcome.rejected,
            started.elapsed().as_secs_f64()
        );
        Ok(ExitCode::SUCCESS)
    }
}
