//! Reading an archive file back: its hash and every row checked, against its
//! manifest and the database's record of the period (`settled verify --archive`).

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Context;
use num_bigint::BigUint;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use super::{hex, Manifest, ARCHIVE_HEADER};
use crate::address::CreatorAddress;
use crate::period::Period;

/// What reading an archive file found.
pub(super) struct FileRead {
    pub(super) rows: i64,
    pub(super) total: BigUint,
    pub(super) sha256: String,
    /// Rows that are not well-formed ledger rows of the period (first few).
    pub(super) problems: Vec<String>,
}

/// Problems listed per archive file.
const MAX_PROBLEMS: usize = 20;

/// Reads an archive data file: its hash, and every row parsed and checked
/// (the header, the period, a valid creator in strictly increasing order,
/// an integer amount, a run id and an attempt of 1 or more).
pub(super) fn read_archive_file(path: &Path, period: Period) -> anyhow::Result<FileRead> {
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
pub(crate) struct ArchiveCheck {
    /// Stable name.
    pub name: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

/// The result of re-checking an archive file.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ArchiveReport {
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
pub(crate) async fn verify_archive(conn: &mut PgConnection, path: &Path) -> anyhow::Result<ArchiveReport> {
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
    pub(crate) fn render(&self) -> String {
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
