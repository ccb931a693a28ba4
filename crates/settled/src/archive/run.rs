//! An archive's transaction from outside: tried again after a lost deadlock,
//! audited, and, when COMMIT got no answer, its outcome learned on a new
//! connection before any file is removed.

use std::path::Path;

use anyhow::Context;
use sqlx::{PgConnection, PgPool};

use super::period::archive_in_tx;
use super::{paths, ArchiveDone, ArchiveOptions, Archived, ARCHIVE_ATTEMPTS, ARCHIVE_LOCK_SQL, COMMIT_OUTCOME_WAIT};
use crate::period::Period;

/// Archives every period before `opts.before` that still has partitions;
/// returns what it archived (nothing is archived if any period is refused).
///
/// Detaching waits for the parents' ACCESS EXCLUSIVE lock while the archive
/// holds its periods' partitions. settled's own sessions never lock an old
/// period's partition (they plan for the period they touch,
/// [`settled_engine::raw::session`]), but another session that holds a parent
/// and then asks for an old partition closes a cycle, and PostgreSQL ends
/// one of the two. When that is the archive, its transaction rolls back
/// whole (files removed) and it starts over, up to `ARCHIVE_ATTEMPTS`.
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
