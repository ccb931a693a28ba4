//! One archive's work inside its transaction: each period checked, exported
//! and read back, its totals carried and recorded, its partitions detached.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use super::verify::read_archive_file;
use super::{hex, paths, ArchiveOptions, Archived, Manifest, ARCHIVE_HEADER, ARCHIVE_LOCK_SQL};
use crate::partitions;
use crate::period::Period;

pub(super) async fn archive_in_tx(
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
