//! `settled import`: streams a CSV or JSON Lines file of (period, creator,
//! volume) into a staging table with PostgreSQL `COPY`, validates every line
//! (naming the line, the field and the reason), and moves the valid rows in
//! the same transaction. All or nothing by default; `--skip-invalid` imports
//! the valid rows and writes the rejected ones, with reasons, to a file
//! (never the input file itself). Each period it adds rows to is held open
//! until the import commits (`crate::settlement::hold_input_open`): its
//! run cannot start meanwhile, and a period whose run started is refused.
//! Memory stays constant: lines are read one at a time (at most
//! `parse::MAX_LINE_BYTES`) and duplicate detection happens in the database.

pub mod parse;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use sqlx::PgPool;

use crate::period::Period;
use crate::progress::Progress;
pub(crate) use parse::{Columns, Format, MAX_LINE_BYTES};

/// Errors printed on the terminal (all of them go to `--errors FILE`).
pub(crate) const MAX_ERRORS_SHOWN: usize = 50;
/// Bytes buffered before they are sent to `COPY`.
pub(crate) const COPY_BATCH_BYTES: usize = 1 << 20;

/// What to import.
#[derive(Debug, Clone)]
pub(crate) struct ImportOptions {
    /// The file, or `-` for standard input.
    pub path: PathBuf,
    /// The format (default: from the extension, `.jsonl`/`.ndjson` or CSV).
    pub format: Option<Format>,
    /// The period of every row (the file may then omit it).
    pub period: Option<Period>,
    /// Import the valid rows, write the rejected ones here.
    pub skip_invalid: Option<PathBuf>,
    /// Write every error here (not only the first [`MAX_ERRORS_SHOWN`]).
    pub errors_file: Option<PathBuf>,
    /// Allow adding rows to a period that already has rows from another import.
    pub append: bool,
}

/// What an import did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct ImportOutcome {
    /// Data lines read.
    pub rows: u64,
    /// Rows inserted now.
    pub inserted: u64,
    /// Rows that were already there, identical (re-import).
    pub already_present: u64,
    /// Rows rejected (only with `--skip-invalid`).
    pub rejected: u64,
    /// Errors found (every invalid line, duplicate or conflict).
    pub errors: u64,
    /// The first errors, for the terminal.
    pub first_errors: Vec<String>,
    /// True when the import was refused and nothing was written.
    pub refused: bool,
}

struct ErrorSink {
    shown: Vec<String>,
    total: u64,
    file: Option<std::io::BufWriter<File>>,
    rejects: Option<std::io::BufWriter<File>>,
}

impl ErrorSink {
    fn record(&mut self, line_no: u64, field: &str, reason: &str, content: Option<&str>) -> anyhow::Result<()> {
        let message = format!("line {line_no}: {field}: {reason}");
        self.total += 1;
        if self.shown.len() < MAX_ERRORS_SHOWN {
            self.shown.push(message.clone());
        }
        if let Some(f) = &mut self.file {
            writeln!(f, "{message}")?;
        }
        if let (Some(r), Some(content)) = (&mut self.rejects, content) {
            let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
            writeln!(r, "{line_no},{field},{},{}", quote(reason), quote(content))?;
        }
        Ok(())
    }
}

/// Reads one line of at most `max` bytes into `buf` (without its `\n`).
/// Returns None at the end, Some(false) for a line that was too long (the
/// rest of it is skipped, never stored).
fn read_bounded_line(reader: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut too_long = false;
    let mut read_any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(read_any.then_some(!too_long));
        }
        read_any = true;
        let (chunk, found_newline) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..i], Some(i)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > max + 1 {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = found_newline.map_or(chunk.len(), |i| i + 1);
        reader.consume(used);
        if found_newline.is_some() {
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            if buf.len() > max {
                too_long = true;
            }
            return Ok(Some(!too_long));
        }
    }
}

/// The latest period a row may have: today anywhere on Earth (UTC+14).
fn latest_period() -> Period {
    Period::from_date((chrono::Utc::now() + chrono::Duration::hours(14)).date_naive())
}

/// Opens the input (a file, or standard input for `-`) and its size when
/// known; refuses an output that is the input ([`refuse_output_over_input`]),
/// before any output is created.
fn open_input(opts: &ImportOptions) -> anyhow::Result<(Box<dyn Read + Send>, Option<u64>)> {
    let (input, size, meta): (Box<dyn Read + Send>, _, _) = if opts.path.as_os_str() == "-" {
        let stdin = std::io::stdin();
        let meta = std::os::fd::AsFd::as_fd(&stdin)
            .try_clone_to_owned()
            .map(File::from)
            .and_then(|f| f.metadata());
        (Box::new(stdin), None, meta.ok())
    } else {
        let file = File::open(&opts.path).with_context(|| format!("opening {}", opts.path.display()))?;
        let meta = file.metadata().ok();
        (Box::new(file), meta.as_ref().map(|m| m.len()), meta)
    };
    if let Some(meta) = meta {
        let outputs = [("--errors", &opts.errors_file), ("--skip-invalid", &opts.skip_invalid)];
        for (flag, path) in outputs {
            if let Some(path) = path {
                refuse_output_over_input(&meta, flag, path)?;
            }
        }
    }
    Ok((input, size))
}

/// Refuses an output file that is the input itself (same device and inode:
/// also through a symlink, a hard link or another path to it), since
/// creating it would empty the input before a line of it was read.
fn refuse_output_over_input(input: &std::fs::Metadata, flag: &str, output: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(out) = std::fs::metadata(output) else {
        return Ok(());
    };
    anyhow::ensure!(
        (out.dev(), out.ino()) != (input.dev(), input.ino()),
        "{flag} {} is the input file itself: writing it would destroy the input; choose another path",
        output.display()
    );
    Ok(())
}

/// Runs an import: the file staged (every line parsed, the good ones
/// copied into a temporary table), the staged rows checked against each
/// other and the table, the periods admitted, the rows inserted; all in one
/// transaction, so a refused import writes nothing.
pub(crate) async fn import(pool: &PgPool, opts: &ImportOptions) -> anyhow::Result<ImportOutcome> {
    let format = format_of(opts);
    let (input, size) = open_input(opts)?;
    let mut sink = ErrorSink::open(opts)?;
    let mut outcome = ImportOutcome::default();

    let mut tx = pool.begin().await?;
    stage(&mut tx, input, size, format, opts, &mut sink, &mut outcome).await?;
    let rejected = check_staged(&mut tx, &mut sink).await?;
    outcome.errors = sink.total;
    if sink.total > 0 && opts.skip_invalid.is_none() {
        tx.rollback().await?;
        outcome.first_errors = std::mem::take(&mut sink.shown);
        outcome.refused = true;
        flush(&mut sink)?;
        return Ok(outcome);
    }
    if !rejected.is_empty() {
        sqlx::query("DELETE FROM import_staging WHERE line_no = ANY($1)")
            .bind(&rejected) // $1
            .execute(&mut *tx)
            .await?;
    }
    outcome.rejected = sink.total;
    let periods = admit_periods(&mut tx, opts).await?;
    let inserted = sqlx::query(
        "INSERT INTO settlement.token_trade_volume (period, creator, volume)
         SELECT period, creator, volume FROM import_staging ORDER BY period, creator
         ON CONFLICT (period, creator) DO NOTHING",
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    // A lost answer may hide a commit: say so, never "nothing was imported".
    tx.commit()
        .await
        .context("committing the import; its outcome is unknown if the connection was lost: importing the same file again is safe (rows already imported are counted as already present, never added twice)")?;
    outcome.inserted = inserted;
    outcome.already_present = outcome.rows - outcome.rejected - inserted;
    outcome.first_errors = std::mem::take(&mut sink.shown);
    flush(&mut sink)?;
    if inserted > 0 {
        let mut conn = pool.acquire().await?;
        for staged in periods.iter().filter(|p| p.new_rows > 0) {
            crate::settlement::queue()
                .refresh_statistics(&mut conn, &staged.period.to_string())
                .await?;
        }
    }
    Ok(outcome)
}

/// The file's format: `--format`, or its extension (`.jsonl`, `.ndjson`:
/// JSONL; anything else: CSV).
fn format_of(opts: &ImportOptions) -> Format {
    opts.format.unwrap_or_else(|| {
        let ext = opts
            .path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        if ext == "jsonl" || ext == "ndjson" {
            Format::Jsonl
        } else {
            Format::Csv
        }
    })
}

impl ErrorSink {
    /// The sink of an import: `--errors-file` and `--skip-invalid`'s
    /// rejects file (with its header) created.
    fn open(opts: &ImportOptions) -> anyhow::Result<ErrorSink> {
        let create = |p: &Path| -> anyhow::Result<std::io::BufWriter<File>> {
            Ok(std::io::BufWriter::new(
                File::create(p).with_context(|| format!("creating {}", p.display()))?,
            ))
        };
        let mut sink = ErrorSink {
            shown: Vec::new(),
            total: 0,
            file: opts.errors_file.as_deref().map(create).transpose()?,
            rejects: opts.skip_invalid.as_deref().map(create).transpose()?,
        };
        if let Some(r) = &mut sink.rejects {
            writeln!(r, "line,field,reason,content")?;
        }
        Ok(sink)
    }
}

/// Reads `input` line by line into the temporary table `import_staging`
/// (by COPY, in batches), parsing each line: a line that does not parse is
/// recorded in `sink`, never staged. Counts the data rows in `outcome`.
async fn stage(
    tx: &mut sqlx::PgConnection,
    input: Box<dyn Read + Send>,
    size: Option<u64>,
    format: Format,
    opts: &ImportOptions,
    sink: &mut ErrorSink,
    outcome: &mut ImportOutcome,
) -> anyhow::Result<()> {
    let progress = Progress::new("import", size.unwrap_or(0));
    let mut reader = BufReader::with_capacity(256 * 1024, CountingReader { inner: input, read: 0 });
    sqlx::query(
        "CREATE TEMP TABLE import_staging (
             line_no bigint NOT NULL, period date NOT NULL, creator text NOT NULL, volume numeric(78,0) NOT NULL
         ) ON COMMIT DROP",
    )
    .execute(&mut *tx)
    .await?;
    let mut copy = tx
        .copy_in_raw("COPY import_staging (line_no, period, creator, volume) FROM STDIN")
        .await?;
    let latest = latest_period();
    let mut buf = Vec::with_capacity(MAX_LINE_BYTES + 2);
    let mut batch = String::with_capacity(COPY_BATCH_BYTES + MAX_LINE_BYTES);
    let mut line_no = 0u64;
    let mut columns: Option<Columns> = None;
    let mut saw_header = false;
    while let Some(fits) = read_bounded_line(&mut reader, &mut buf, MAX_LINE_BYTES)? {
        line_no += 1;
        if line_no == 1 && buf.starts_with(b"\xEF\xBB\xBF") {
            buf.drain(..3);
        }
        if !fits {
            outcome.rows += 1;
            sink.record(
                line_no,
                "line",
                &format!("is longer than {MAX_LINE_BYTES} bytes"),
                Some("(too long to repeat)"),
            )?;
            continue;
        }
        let Ok(line) = std::str::from_utf8(&buf) else {
            outcome.rows += 1;
            sink.record(line_no, "line", "is not valid UTF-8", Some("(not UTF-8)"))?;
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        if format == Format::Csv && !saw_header && outcome.rows == 0 {
            saw_header = true;
            if let Some(header) = parse::csv_header(line) {
                if header == Columns::CreatorVolume && opts.period.is_none() {
                    anyhow::bail!("line {line_no}: the header has no period column: give the period with --period");
                }
                columns = Some(header);
                continue;
            }
        }
        outcome.rows += 1;
        let parsed = match format {
            Format::Csv => {
                let cols = columns.unwrap_or(if opts.period.is_some() && line.split(',').count() == 2 {
                    Columns::CreatorVolume
                } else {
                    Columns::PeriodCreatorVolume
                });
                parse::parse_csv(line, cols, opts.period, latest)
            }
            Format::Jsonl => parse::parse_jsonl(line, opts.period, latest),
        };
        match parsed {
            Ok(row) => {
                use std::fmt::Write as _;
                let _ = writeln!(batch, "{line_no}\t{}\t{}\t{}", row.period, row.creator, row.volume);
                if batch.len() >= COPY_BATCH_BYTES {
                    copy.send(batch.as_bytes()).await?;
                    batch.clear();
                    progress.set(reader.get_ref().read);
                }
            }
            Err(e) => sink.record(line_no, e.field, &e.reason, Some(line))?,
        }
    }
    if !batch.is_empty() {
        copy.send(batch.as_bytes()).await?;
    }
    copy.finish().await?;
    progress.finish();
    if line_no == 0 {
        anyhow::bail!("the file is empty: nothing to import");
    }
    if outcome.rows == 0 {
        anyhow::bail!("the file has no data rows (only a header or blank lines): nothing to import");
    }
    Ok(())
}

/// The staged rows that may not be imported, each recorded in `sink`:
/// every later occurrence of a (period, creator) within the file, and rows
/// already imported with another volume (refusing keeps re-imports exact).
/// Returns their line numbers.
async fn check_staged(tx: &mut sqlx::PgConnection, sink: &mut ErrorSink) -> anyhow::Result<Vec<i64>> {
    let duplicates: Vec<Duplicate> = sqlx::query_as(
        "SELECT line_no, creator, period, first_line FROM (
             SELECT line_no, creator, period,
                    min(line_no) OVER (PARTITION BY period, creator) AS first_line
             FROM import_staging) d
         WHERE line_no <> first_line ORDER BY line_no",
    )
    .fetch_all(&mut *tx)
    .await?;
    for d in &duplicates {
        sink.record(
            d.line_no as u64,
            "creator",
            &format!("duplicate of line {} for ({}, {})", d.first_line, d.period, d.creator),
            Some(&d.creator),
        )?;
    }
    let conflicts: Vec<Conflict> = sqlx::query_as(
        "SELECT s.line_no, s.creator, s.period, s.volume::text AS new_volume, t.volume::text AS old_volume
         FROM import_staging s JOIN settlement.token_trade_volume t ON t.period = s.period AND t.creator = s.creator
         WHERE t.volume <> s.volume ORDER BY s.line_no",
    )
    .fetch_all(&mut *tx)
    .await?;
    for c in &conflicts {
        sink.record(
            c.line_no as u64,
            "volume",
            &format!(
                "({}, {}) was already imported with volume {}, not {}",
                c.period, c.creator, c.old_volume, c.new_volume
            ),
            Some(&c.creator),
        )?;
    }
    Ok(duplicates
        .iter()
        .map(|d| d.line_no)
        .chain(conflicts.iter().map(|c| c.line_no))
        .collect())
}

/// The staged periods, each admitted: never one whose run has started
/// (held open until this import commits), another import's period only
/// with `--append`, and its partitions made. A refusal is an error saying
/// why; the import's transaction rolls back as it is dropped.
async fn admit_periods(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    opts: &ImportOptions,
) -> anyhow::Result<Vec<StagedPeriod>> {
    let periods: Vec<StagedPeriod> = sqlx::query_as(
        "SELECT s.period,
                count(*) FILTER (WHERE t.creator IS NULL) AS new_rows,
                (SELECT count(*) FROM settlement.token_trade_volume x WHERE x.period = s.period) AS existing
         FROM import_staging s
         LEFT JOIN settlement.token_trade_volume t ON t.period = s.period AND t.creator = s.creator
         GROUP BY s.period ORDER BY s.period",
    )
    .fetch_all(&mut **tx)
    .await?;
    for StagedPeriod {
        period,
        new_rows,
        existing,
    } in &periods
    {
        if *new_rows == 0 {
            continue;
        }
        // Until this import commits, no run of the period can start.
        crate::settlement::hold_input_open(tx, Period::from_date(*period))
            .await
            .map_err(|refused| anyhow::anyhow!("{refused:#}; nothing was imported"))?;
        if *existing > 0 && !opts.append {
            anyhow::bail!(
                "period {period} already has {existing} rows from another import; use --append to add {new_rows} more; nothing was imported"
            );
        }
    }
    for StagedPeriod { period, new_rows, .. } in &periods {
        if *new_rows > 0 {
            crate::partitions::ensure(tx, Period::from_date(*period)).await?;
        }
    }
    Ok(periods)
}

fn flush(sink: &mut ErrorSink) -> anyhow::Result<()> {
    if let Some(f) = &mut sink.file {
        f.flush()?;
    }
    if let Some(r) = &mut sink.rejects {
        r.flush()?;
    }
    Ok(())
}

/// Counts the bytes read, for progress.
struct CountingReader<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::read_bounded_line;

    #[test]
    fn bounded_lines() {
        let data = b"short\r\nway too long line\nlast";
        let mut reader = std::io::BufReader::with_capacity(4, &data[..]);
        let mut buf = Vec::new();
        assert_eq!(read_bounded_line(&mut reader, &mut buf, 8).unwrap(), Some(true));
        assert_eq!(buf, b"short");
        assert_eq!(read_bounded_line(&mut reader, &mut buf, 8).unwrap(), Some(false));
        assert_eq!(read_bounded_line(&mut reader, &mut buf, 8).unwrap(), Some(true));
        assert_eq!(buf, b"last");
        assert_eq!(read_bounded_line(&mut reader, &mut buf, 8).unwrap(), None);
    }
}

/// A row repeated within the file.
#[derive(sqlx::FromRow)]
struct Duplicate {
    line_no: i64,
    creator: String,
    period: chrono::NaiveDate,
    first_line: i64,
}

/// A row already imported with another volume.
#[derive(sqlx::FromRow)]
struct Conflict {
    line_no: i64,
    creator: String,
    period: chrono::NaiveDate,
    new_volume: String,
    old_volume: String,
}

/// A period of the staged rows: how many are new, how many it has already.
#[derive(sqlx::FromRow)]
struct StagedPeriod {
    period: chrono::NaiveDate,
    new_rows: i64,
    existing: i64,
}
