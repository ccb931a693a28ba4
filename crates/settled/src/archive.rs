//! `settled archive`: old periods leave the hot tables whole. For each
//! settled period before a date, in one transaction (all or nothing):
//!
//! 1. its two partitions are locked against writers (SHARE ROW EXCLUSIVE;
//!    one archive runs at a time, behind a transaction advisory lock);
//! 2. its ledger partition is exported with COPY, in creator order, to
//!    `DIR/ledger-YYYY-MM-DD.csv`, with a manifest beside it
//!    (`.manifest.json`: rows, total, SHA-256 of the file's bytes); the file
//!    is read back by [`verify_archive`] and must match the database's own
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

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use futures_util::StreamExt;
use num_bigint::BigUint;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};

use crate::address::CreatorAddress;
use crate::partitions;
use crate::period::Period;

/// The header line of an archive file: the ledger's columns, in order.
pub const ARCHIVE_HEADER: &str = "period,creator,amount,run_id,attempt,created_at";

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
pub const DAEMON_ACTOR: &str = "worker --archive-after-days";

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
pub fn paths(dir: &Path, period: Period) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("ledger-{period}.csv")),
        dir.join(format!("ledger-{period}.manifest.json")),
    )
}

/// How many times an archive that lost a deadlock is tried in all.
pub const ARCHIVE_ATTEMPTS: u32 = 5;
/// How long an archive whose COMMIT got no answer waits to learn whether
/// it committed (a new connection, then the archive's lock, which the lost
/// transaction holds until it ends) before it says the outcome is unknown.
pub const COMMIT_OUTCOME_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What an archive did.
#[derive(Debug, Clone)]
pub struct ArchiveDone {
    /// The periods archived, in order.
    pub archived: Vec<Archived>,
    /// True when the answer to COMMIT was lost and a new connection found
    /// the archive committed.
    pub committed_unanswered: bool,
}

/// Archives every period before `opts.before` that still has partitions;
/// returns what it archived (nothing is archived if any period is refused).
///
/// Detaching waits for the parents' ACCESS EXCLUSIVE lock while the archive
/// holds its periods' partitions. settled's own sessions never lock an old
/// period's partition (they plan for the period they touch,
/// [`settled_engine::raw::session`]), but another session that holds a parent
/// and then asks for an old partition closes a cycle, and PostgreSQL ends
/// one of the two. When that is the archive, its transaction rolls back
/// whole (files removed) and it starts over, up to [`ARCHIVE_ATTEMPTS`].
///
/// Files are removed only when their periods are certainly not archived:
/// before the rollback of a transaction that never sent COMMIT (it still
/// holds the archive's lock, unless its connection is gone), or, when
/// COMMIT got no answer, under the lock on a new connection from `pool`
/// once the lost transaction has ended (`learn_commit_outcome`).
pub async fn archive(pool: &PgPool, opts: &ArchiveOptions) -> anyhow::Result<ArchiveDone> {
    let mut attempt = 1;
    loop {
        match archive_once(pool, opts).await {
            Err(err) if attempt < ARCHIVE_ATTEMPTS && lost_a_deadlock(&err) => {
                tracing::warn!(attempt, error = %err, "the archive lost a deadlock and rolled back; starting over");
                tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(attempt))).await;
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// True when PostgreSQL ended the transaction to break a deadlock.
fn lost_a_deadlock(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .and_then(|db| db.code())
            .is_some_and(|code| code == "40P01")
    })
}

/// Taken first by every archive, released when its transaction ends.
const ARCHIVE_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtext('settled archive'))";

/// One try of [`archive`], in one transaction on a connection of its own.
async fn archive_once(pool: &PgPool, opts: &ArchiveOptions) -> anyhow::Result<ArchiveDone> {
    std::fs::create_dir_all(&opts.dir).with_context(|| format!("creating {}", opts.dir.display()))?;
    let mut conn = pool.acquire().await?;
    sqlx::query("BEGIN").execute(&mut *conn).await?;
    let mut written: Vec<Period> = Vec::new();
    let archived = match archive_and_audit(&mut conn, opts, &mut written).await {
        Ok(archived) => archived,
        Err(err) => {
            // COMMIT was never sent: nothing is archived. The files go
            // before the rollback, while this transaction still holds the
            // archive's lock, so no other archive is writing them.
            remove_files(&opts.dir, &written);
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            return Err(err);
        }
    };
    let committed = sqlx::query("COMMIT").execute(&mut *conn).await;
    let Err(commit_err) = committed else {
        return Ok(ArchiveDone {
            archived,
            committed_unanswered: false,
        });
    };
    // The server may have committed before its answer was lost: this
    // connection is done, and only a new one can tell.
    conn.close_on_drop();
    drop(conn);
    settle_unanswered_commit(pool, opts, archived, commit_err).await
}

/// [`archive_in_tx`], and the audit row of what it archived (when it did),
/// in the same transaction.
async fn archive_and_audit(
    conn: &mut PgConnection,
    opts: &ArchiveOptions,
    written: &mut Vec<Period>,
) -> anyhow::Result<Vec<Archived>> {
    let archived = archive_in_tx(conn, opts, written).await?;
    if !archived.is_empty() {
        let periods: Vec<String> = archived.iter().map(|a| a.period.to_string()).collect();
        let target = format!("periods {}", periods.join(" "));
        let actor = match &opts.actor {
            Some(actor) => actor.clone(),
            None => crate::audit::cli_actor(&mut *conn).await?,
        };
        let entry = crate::audit::Entry {
            actor,
            action: "archive".to_string(),
            target,
            outcome: crate::audit::OK.to_string(),
        };
        crate::audit::record(conn, &entry).await?;
    }
    Ok(archived)
}

/// After a COMMIT that returned an error: keeps the files when the archive
/// committed (and says so), removes them when it certainly did not, keeps
/// them and says the outcome is unknown when it cannot be learned.
async fn settle_unanswered_commit(
    pool: &PgPool,
    opts: &ArchiveOptions,
    archived: Vec<Archived>,
    commit_err: sqlx::Error,
) -> anyhow::Result<ArchiveDone> {
    let periods: Vec<Period> = archived.iter().map(|a| a.period).collect();
    match learn_commit_outcome(pool, opts, &archived).await {
        Ok(CommitOutcome::Committed) => Ok(ArchiveDone {
            archived,
            committed_unanswered: true,
        }),
        Ok(CommitOutcome::NotCommitted) => Err(anyhow::Error::new(commit_err).context(
            "committing the archive failed, and a new connection found it not committed: \
             its files were removed and nothing was archived",
        )),
        Err(learn_err) => {
            let files: Vec<String> = periods
                .iter()
                .map(|p| paths(&opts.dir, *p).0.display().to_string())
                .collect();
            anyhow::bail!(
                "the outcome of the archive is unknown: COMMIT was sent but no answer came back ({commit_err}), \
                 and a new connection could not learn whether it committed ({learn_err:#}). \
                 The files are kept. Check each with `settled verify --archive FILE` \
                 (OK: archived; \"no archive\": not archived, and its files may be removed): {}",
                files.join(" ")
            )
        }
    }
}

/// What a new connection learned about an unanswered COMMIT.
enum CommitOutcome {
    Committed,
    NotCommitted,
}

/// Waits (at most [`COMMIT_OUTCOME_WAIT`]) for the archive's lock on a new
/// connection: the lost transaction holds it until it has committed or
/// rolled back. Then `settlement.archived_periods` tells: every period
/// recorded with this archive's SHA-256 is a commit; anything less is
/// certainly none (the transaction was all or nothing), and the files of
/// the periods nobody archived are removed while the lock is held. An error
/// or the time running out leaves the outcome unknown.
async fn learn_commit_outcome(
    pool: &PgPool,
    opts: &ArchiveOptions,
    archived: &[Archived],
) -> anyhow::Result<CommitOutcome> {
    let learn = async {
        let mut tx = pool.begin().await.context("connecting again")?;
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(format!("{}ms", COMMIT_OUTCOME_WAIT.as_millis())) // $1
            .execute(&mut *tx)
            .await?;
        sqlx::query(ARCHIVE_LOCK_SQL)
            .execute(&mut *tx)
            .await
            .context("waiting for the lost transaction to end")?;
        let dates: Vec<chrono::NaiveDate> = archived.iter().map(|a| a.period.date()).collect();
        let recorded: Vec<(chrono::NaiveDate, String)> =
            sqlx::query_as("SELECT period, sha256 FROM settlement.archived_periods WHERE period = ANY($1)")
                .bind(&dates) // $1
                .fetch_all(&mut *tx)
                .await?;
        let ours = |a: &Archived| recorded.contains(&(a.period.date(), a.manifest.sha256.clone()));
        let outcome = if archived.iter().all(ours) {
            CommitOutcome::Committed
        } else {
            // All or nothing, so not ours; a period another archive
            // recorded meanwhile keeps the files that archive wrote.
            let unrecorded: Vec<Period> = archived
                .iter()
                .map(|a| a.period)
                .filter(|p| !recorded.iter().any(|(date, _)| *date == p.date()))
                .collect();
            remove_files(&opts.dir, &unrecorded);
            CommitOutcome::NotCommitted
        };
        tx.rollback().await?;
        Ok(outcome)
    };
    tokio::time::timeout(COMMIT_OUTCOME_WAIT + std::time::Duration::from_secs(5), learn)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} s", COMMIT_OUTCOME_WAIT.as_secs()))?
}

/// Removes what an archive that did not commit wrote for `periods` (the
/// data file, its manifest, a partial export); a file already gone is fine.
fn remove_files(dir: &Path, periods: &[Period]) {
    for period in periods {
        let (data, manifest) = paths(dir, *period);
        for path in [data.with_extension("csv.partial"), data, manifest] {
            if let Err(err) = std::fs::remove_file(&path) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(file = %path.display(), error = %err, "could not remove a file of an archive that did not commit");
                }
            }
        }
    }
}

async fn archive_in_tx(
    conn: &mut PgConnection,
    opts: &ArchiveOptions,
    written: &mut Vec<Period>,
) -> anyhow::Result<Vec<Archived>> {
    // One archive at a time: a second one waits here, then finds the
    // periods the first archived gone (and never touches its files).
    sqlx::query(ARCHIVE_LOCK_SQL).execute(&mut *conn).await?;
    // Periods that still have a partition in either table: the partition
    // names carry the period (settlement.ensure_period_partitions names them).
    let periods: Vec<chrono::NaiveDate> = sqlx::query_scalar(
        "SELECT DISTINCT to_date(substring(c.relname from '_p([0-9]{8})$'), 'YYYYMMDD') AS period
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent IN ('settlement.token_trade_volume'::regclass, 'settlement.reward_ledger'::regclass)
           AND c.relname ~ '_p[0-9]{8}$'
           AND to_date(substring(c.relname from '_p([0-9]{8})$'), 'YYYYMMDD') < $1
         ORDER BY 1",
    )
    .bind(opts.before) // $1
    .fetch_all(&mut *conn)
    .await?;
    let mut refusals = Vec::new();
    let mut archived = Vec::new();
    for date in periods {
        let period = Period::from_date(date);
        let (work, ledger) = partitions::names(period);
        sqlx::query(&format!(
            "LOCK TABLE settlement.{work}, settlement.{ledger} IN SHARE ROW EXCLUSIVE MODE"
        ))
        .execute(&mut *conn)
        .await
        .with_context(|| format!("locking the partitions of {period}"))?;
        if let Some(reason) = refusal(conn, period).await? {
            refusals.push(format!("{period}: {reason}"));
            continue;
        }
        if !refusals.is_empty() {
            continue;
        }
        archived.push(export(conn, period, &opts.dir, written).await?);
    }
    if !refusals.is_empty() {
        anyhow::bail!("nothing was archived; refused:\n  {}", refusals.join("\n  "));
    }
    for a in &mut archived {
        a.kept_as = retire(conn, a.period, opts.drop_ledger).await?;
        sqlx::query("UPDATE settlement.archived_periods SET kept_as = $2 WHERE period = $1")
            .bind(a.period.date()) // $1
            .bind(&a.kept_as) // $2
            .execute(&mut *conn)
            .await?;
    }
    Ok(archived)
}

/// Why `period` may not be archived, if it may not.
async fn refusal(conn: &mut PgConnection, period: Period) -> anyhow::Result<Option<String>> {
    let run_state = crate::settlement::job()
        .find_run(&mut *conn, &period.to_string())
        .await?
        .map(|run| run.state.as_str().to_string());
    let unsettled: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status, count(*) FROM settlement.token_trade_volume
         WHERE period = $1 AND status <> 'settled' GROUP BY status ORDER BY status",
    )
    .bind(period.date()) // $1
    .fetch_all(&mut *conn)
    .await?;
    let has_items: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM settlement.token_trade_volume WHERE period = $1)
             OR EXISTS (SELECT 1 FROM settlement.reward_ledger WHERE period = $1)",
    )
    .bind(period.date()) // $1
    .fetch_one(&mut *conn)
    .await?;
    Ok(match run_state.as_deref() {
        Some("finished") if unsettled.is_empty() => None,
        None if !has_items => None,
        None => Some("it has items but no run".into()),
        Some(state) if state != "finished" => Some(format!("its run is {state}")),
        Some(_) => Some(format!(
            "items not settled: {}",
            unsettled
                .iter()
                .map(|(s, n)| format!("{n} {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    })
}

/// Writes `period`'s ledger partition to its file and manifest, checks the
/// file against the database's count and sum, carries each creator's total
/// and records the period.
async fn export(
    conn: &mut PgConnection,
    period: Period,
    dir: &Path,
    written: &mut Vec<Period>,
) -> anyhow::Result<Archived> {
    let (_, ledger) = partitions::names(period);
    let (path, manifest_path) = paths(dir, period);
    let partial = path.with_extension("csv.partial");
    written.push(period);
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?,
    );
    let mut hasher = Sha256::new();
    {
        // Creator order in bytes (COLLATE "C"), so the file is the same on
        // any server and its order proves each creator appears once.
        let mut stream = conn
            .copy_out_raw(&format!(
                "COPY (SELECT {ARCHIVE_HEADER} FROM settlement.{ledger} ORDER BY creator COLLATE \"C\")
                 TO STDOUT WITH (FORMAT csv, HEADER)"
            ))
            .await
            .with_context(|| format!("exporting the ledger of {period}"))?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            hasher.update(&chunk);
            file.write_all(&chunk)?;
        }
    }
    let file = file.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    let (rows, total): (i64, String) = sqlx::query_as(&format!(
        "SELECT count(*), coalesce(sum(amount), 0)::text FROM settlement.{ledger}"
    ))
    .fetch_one(&mut *conn)
    .await?;
    let manifest = Manifest {
        period: period.to_string(),
        rows,
        total,
        sha256: hex(&hasher.finalize()),
        file: path.file_name().unwrap_or_default().to_string_lossy().into_owned(),
    };
    // Read back what was written: the file must say what the database says.
    let read = read_archive_file(&partial, period)?;
    anyhow::ensure!(
        read.rows == manifest.rows && read.total.to_string() == manifest.total && read.sha256 == manifest.sha256,
        "the export of {period} does not read back as written ({} rows, total {}; the database has {} rows, total {})",
        read.rows,
        read.total,
        manifest.rows,
        manifest.total
    );
    anyhow::ensure!(
        read.problems.is_empty(),
        "the export of {period}: {}",
        read.problems.join("; ")
    );
    std::fs::rename(&partial, &path)?;
    let mut m = std::fs::File::create(&manifest_path)?;
    m.write_all(serde_json::to_string_pretty(&manifest)?.as_bytes())?;
    m.write_all(b"\n")?;
    m.sync_all()?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }

    sqlx::query(&format!(
        "INSERT INTO settlement.ledger_carry AS c (creator, amount)
         SELECT creator, sum(amount) FROM settlement.{ledger} GROUP BY creator ORDER BY creator
         ON CONFLICT (creator) DO UPDATE SET amount = c.amount + EXCLUDED.amount, updated_at = now()"
    ))
    .execute(&mut *conn)
    .await
    .context("carrying the period's totals")?;
    sqlx::query(
        "INSERT INTO settlement.archived_periods (period, ledger_rows, ledger_total, sha256, file)
         VALUES ($1, $2, $3::numeric, $4, $5)",
    )
    .bind(period.date()) // $1
    .bind(manifest.rows) // $2
    .bind(&manifest.total) // $3
    .bind(&manifest.sha256) // $4
    .bind(path.to_string_lossy().as_ref()) // $5
    .execute(&mut *conn)
    .await?;
    Ok(Archived {
        period,
        manifest,
        path,
        kept_as: None,
    })
}

/// Detaches `period`'s partitions: the ledger's is kept in
/// `settlement_archive` (returned) or dropped; the work table's is dropped.
async fn retire(conn: &mut PgConnection, period: Period, drop_ledger: bool) -> anyhow::Result<Option<String>> {
    let (work, ledger) = partitions::names(period);
    sqlx::query(&format!(
        "ALTER TABLE settlement.reward_ledger DETACH PARTITION settlement.{ledger}"
    ))
    .execute(&mut *conn)
    .await?;
    let kept_as = if drop_ledger {
        sqlx::query(&format!("DROP TABLE settlement.{ledger}"))
            .execute(&mut *conn)
            .await?;
        None
    } else {
        sqlx::query(&format!(
            "ALTER TABLE settlement.{ledger} SET SCHEMA settlement_archive"
        ))
        .execute(&mut *conn)
        .await?;
        // Detaching dropped the row trigger cloned from the parent; the kept
        // rows stay append-only (the TRUNCATE trigger was the partition's own).
        sqlx::query(&format!(
            "CREATE TRIGGER reward_ledger_append_only BEFORE UPDATE OR DELETE ON settlement_archive.{ledger}
             FOR EACH ROW EXECUTE FUNCTION settlement.refuse_ledger_change()"
        ))
        .execute(&mut *conn)
        .await?;
        Some(format!("settlement_archive.{ledger}"))
    };
    sqlx::query(&format!(
        "ALTER TABLE settlement.token_trade_volume DETACH PARTITION settlement.{work}"
    ))
    .execute(&mut *conn)
    .await?;
    sqlx::query(&format!("DROP TABLE settlement.{work}"))
        .execute(&mut *conn)
        .await?;
    Ok(kept_as)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What reading an archive file found.
struct FileRead {
    rows: i64,
    total: BigUint,
    sha256: String,
    /// Rows that are not well-formed ledger rows of the period (first few).
    problems: Vec<String>,
}

/// Problems listed per archive file.
const MAX_PROBLEMS: usize = 20;

/// Reads an archive data file: its hash, and every row parsed and checked
/// (the header, the period, a valid creator in strictly increasing order,
/// an integer amount, a run id and an attempt of 1 or more).
fn read_archive_file(path: &Path, period: Period) -> anyhow::Result<FileRead> {
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut read = FileRead {
        rows: 0,
        total: BigUint::default(),
        sha256: String::new(),
        problems: Vec::new(),
    };
    let want_period = period.to_string();
    let mut last_creator = String::new();
    let mut line = String::new();
    let mut line_no = 0usize;
    loop {
        line.clear();
        if reader
            .read_line(&mut line)
            .with_context(|| format!("reading {}", path.display()))?
            == 0
        {
            break;
        }
        hasher.update(line.as_bytes());
        line_no += 1;
        let text = line.strip_suffix('\n').unwrap_or(&line);
        if line_no == 1 {
            if text != ARCHIVE_HEADER {
                read.problem(format!("line 1: header {text:?}, expected {ARCHIVE_HEADER:?}"));
            }
            continue;
        }
        let fields: Vec<&str> = text.split(',').collect();
        let [p, creator, amount, run_id, attempt, _created] = fields.as_slice() else {
            read.problem(format!("line {line_no}: {} fields, expected 6", fields.len()));
            continue;
        };
        read.rows += 1;
        if *p != want_period {
            read.problem(format!("line {line_no}: period {p}, expected {want_period}"));
        }
        if !CreatorAddress::parse(creator).is_ok_and(|a| a.as_str() == *creator) {
            read.problem(format!("line {line_no}: creator {creator:?} is not an address"));
        }
        if read.rows > 1 && last_creator.as_str() >= *creator {
            read.problem(format!(
                "line {line_no}: creator {creator} is not after the previous one (repeated or out of order)"
            ));
        }
        last_creator.clear();
        last_creator.push_str(creator);
        match BigUint::parse_bytes(amount.as_bytes(), 10) {
            Some(a) if amount.bytes().all(|b| b.is_ascii_digit()) => read.total += a,
            _ => read.problem(format!("line {line_no}: amount {amount:?} is not a whole number")),
        }
        if run_id.parse::<i64>().is_err() {
            read.problem(format!("line {line_no}: run_id {run_id:?} is not a run id"));
        }
        if !attempt.parse::<i32>().is_ok_and(|a| a >= 1) {
            read.problem(format!("line {line_no}: attempt {attempt:?} is not 1 or more"));
        }
    }
    if line_no == 0 {
        read.problem("line 1: no header".into());
    }
    read.sha256 = hex(&hasher.finalize());
    Ok(read)
}

impl FileRead {
    fn problem(&mut self, text: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(text);
        }
    }
}

/// One check of an archive.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArchiveCheck {
    /// Stable name.
    pub name: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

/// The result of re-checking an archive file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArchiveReport {
    /// The data file.
    pub file: String,
    /// Its period.
    pub period: String,
    /// True when every check holds.
    pub ok: bool,
    /// The checks, in order.
    pub checks: Vec<ArchiveCheck>,
}

/// Re-checks an archive (`path`: its data file or its manifest) against
/// its manifest and the database's record of the period.
pub async fn verify_archive(conn: &mut PgConnection, path: &Path) -> anyhow::Result<ArchiveReport> {
    let name = path.to_string_lossy();
    let manifest_path = match name.strip_suffix(".csv") {
        Some(stem) => PathBuf::from(format!("{stem}.manifest.json")),
        None => path.to_path_buf(),
    };
    let manifest: Manifest = serde_json::from_slice(
        &std::fs::read(&manifest_path).with_context(|| format!("reading the manifest {}", manifest_path.display()))?,
    )
    .with_context(|| format!("{} is not an archive manifest", manifest_path.display()))?;
    let period = Period::parse(&manifest.period).map_err(anyhow::Error::msg)?;
    let data = manifest_path.with_file_name(&manifest.file);
    let read = read_archive_file(&data, period)?;
    let mut checks = vec![
        ArchiveCheck {
            name: "file_matches_manifest_sha256",
            ok: read.sha256 == manifest.sha256,
            detail: format!("file {} , manifest {}", read.sha256, manifest.sha256),
        },
        ArchiveCheck {
            name: "rows_are_ledger_rows_of_the_period",
            ok: read.problems.is_empty(),
            detail: if read.problems.is_empty() {
                format!("{} rows, each creator once", read.rows)
            } else {
                read.problems.join("; ")
            },
        },
        ArchiveCheck {
            name: "row_count_matches_manifest",
            ok: read.rows == manifest.rows,
            detail: format!("file {}, manifest {}", read.rows, manifest.rows),
        },
        ArchiveCheck {
            name: "total_matches_manifest",
            ok: read.total.to_string() == manifest.total,
            detail: format!("file {}, manifest {}", read.total, manifest.total),
        },
    ];
    let record: Option<(i64, String, String)> = sqlx::query_as(
        "SELECT ledger_rows, ledger_total::text, sha256 FROM settlement.archived_periods WHERE period = $1",
    )
    .bind(period.date()) // $1
    .fetch_optional(&mut *conn)
    .await?;
    checks.push(match record {
        Some((rows, total, sha)) => ArchiveCheck {
            name: "database_record_matches",
            ok: rows == read.rows && total == read.total.to_string() && sha == read.sha256,
            detail: format!("database: {rows} rows, total {total}, sha256 {sha}"),
        },
        None => ArchiveCheck {
            name: "database_record_matches",
            ok: false,
            detail: format!("this database has no archive of {period}"),
        },
    });
    Ok(ArchiveReport {
        file: data.to_string_lossy().into_owned(),
        period: manifest.period,
        ok: checks.iter().all(|c| c.ok),
        checks,
    })
}

impl ArchiveReport {
    /// The human rendering.
    pub fn render(&self) -> String {
        let mut out = format!(
            "verify archive {} ({}): {}\n",
            self.file,
            self.period,
            if self.ok { "OK, every check holds" } else { "FAILED" }
        );
        for c in &self.checks {
            out.push_str(&format!(
                "  [{}] {}: {}\n",
                if c.ok { "ok" } else { "FAIL" },
                c.name,
                c.detail
            ));
        }
        out
    }
}
