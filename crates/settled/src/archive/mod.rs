//! `settled archive`: old periods leave the hot tables whole. For each
//! settled period before a date, in one transaction (all or nothing):
//!
//! 1. its two partitions are locked against writers (SHARE ROW EXCLUSIVE;
//!    one archive runs at a time, behind a transaction advisory lock);
//! 2. its ledger partition is exported with COPY, in creator order, to
//!    `DIR/ledger-YYYY-MM-DD.csv`, with a manifest beside it
//!    (`.manifest.json`: rows, total, SHA-256 of the file's bytes); the file
//!    is read back by `verify_archive` and must match the database's own
//!    count and sum before anything else happens;
//! 3. each creator's total for the period is added to
//!    `settlement.ledger_carry` (so balances stay provable), and the period
//!    is recorded in `settlement.archived_periods`;
//! 4. the ledger partition is detached and kept as
//!    `settlement_archive.reward_ledger_pYYYYMMDD` (append-only, like the
//!    ledger) or dropped with `--drop-ledger`; the work-table partition is
//!    detached and dropped. Detaching waits for the brief ACCESS EXCLUSIVE
//!    lock on the parents, taken last, after every export.
//!
//! Once COMMIT has been sent, no file is removed on the spot: when COMMIT
//! returns an error, a new connection waits for the lost transaction to end
//! and reads `settlement.archived_periods`; the files go only when the
//! archive certainly did not commit, and stay, with an error that says the
//! outcome is unknown, when that cannot be learned.
//!
//! A period is refused unless its run finished and every item is settled
//! (an eligible, processing, failed or held item is work that may still be
//! paid). An archived period can take no new items: its partitions cannot
//! be created again (`settlement.ensure_period_partitions` refuses).

mod period;
mod run;
mod verify;

pub use run::archive;
pub(crate) use verify::verify_archive;

use std::path::{Path, PathBuf};

use crate::period::Period;

/// The header line of an archive file: the ledger's columns, in order.
pub(crate) const ARCHIVE_HEADER: &str = "period,creator,amount,run_id,attempt,created_at";

/// What to archive.
#[derive(Debug, Clone)]
pub struct ArchiveOptions {
    /// Archive periods strictly before this date.
    pub before: chrono::NaiveDate,
    /// Where the files go (created if missing).
    pub dir: PathBuf,
    /// Drop the detached ledger partition instead of keeping it in
    /// `settlement_archive`.
    pub drop_ledger: bool,
    /// Who archives, for the audit log (None: the CLI's operator,
    /// `cli:<login>/<OS user>`).
    pub actor: Option<String>,
}

/// The audit log's actor of the worker daemon's archive (`--archive-after-days`).
pub(crate) const DAEMON_ACTOR: &str = "worker --archive-after-days";

/// A period's archive, as its manifest and `settlement.archived_periods` hold it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// The period.
    pub period: String,
    /// Ledger rows in the file.
    pub rows: i64,
    /// Sum of their amounts (base units).
    pub total: String,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub sha256: String,
    /// The file's name (beside the manifest).
    pub file: String,
}

/// One archived period.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Archived {
    /// The period (its manifest names it too).
    #[serde(skip)]
    pub period: Period,
    /// Its manifest.
    pub manifest: Manifest,
    /// Where the data file is.
    pub path: PathBuf,
    /// Where the detached ledger partition is kept (None: dropped).
    pub kept_as: Option<String>,
}

/// The data file and manifest paths of `period` in `dir`.
pub(crate) fn paths(dir: &Path, period: Period) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("ledger-{period}.csv")),
        dir.join(format!("ledger-{period}.manifest.json")),
    )
}

/// How many times an archive that lost a deadlock is tried in all.
pub(crate) const ARCHIVE_ATTEMPTS: u32 = 5;
/// How long an archive whose COMMIT got no answer waits to learn whether
/// it committed (a new connection, then the archive's lock, which the lost
/// transaction holds until it ends) before it says the outcome is unknown.
pub(crate) const COMMIT_OUTCOME_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What an archive did.
#[derive(Debug, Clone)]
pub struct ArchiveDone {
    /// The periods archived, in order.
    pub archived: Vec<Archived>,
    /// True when the answer to COMMIT was lost and a new connection found
    /// the archive committed.
    pub committed_unanswered: bool,
}

/// Taken first by every archive, released when its transaction ends.
const ARCHIVE_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtext('settled archive'))";

/// Lower-case hex of a digest.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
