//! The report of `settled bench --continuous`: one row per case, the
//! medians over runs, the targets and the markdown.

mod markdown;
mod targets;
#[cfg(test)]
mod tests;

pub use markdown::markdown;
use markdown::ms;
use targets::{medians, targets};

use anyhow::Context;
use sqlx::{Connection, PgConnection};

use super::systems::Described;
use super::workload::{DbWork, Measured, TableSample};
use super::{CaseSpec, ContinuousOptions, Producer};

/// Seconds of a case from which its tables are shown over time.
pub(super) const SERIES_CASE_SECS_MIN: f64 = 60.0;
/// The spacing of the rows of that table, seconds.
pub(super) const SERIES_ROW_SECS: f64 = 30.0;
/// The W values the throughput and latency targets are set at.
pub(super) const TARGET_WORKERS: [u32; 2] = [16, 64];
/// Settled in-transaction's jobs/s over the fastest peer's, at least.
pub(super) const TARGET_THROUGHPUT_RATIO: f64 = 1.5;
/// Share of the enqueued jobs a system must have handled for its pickup
/// percentiles to stand: below it, the jobs never started (not in the
/// percentiles) waited longer than any that did.
pub(super) const PICKUP_HANDLED_SHARE_MIN: f64 = 0.99;

/// One measured case.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ContinuousCase {
    /// The system measured.
    pub system: String,
    /// How jobs were offered.
    pub producer: Producer,
    /// Workers.
    pub workers: u32,
    /// Which repetition of the case (1-based).
    pub run: u32,
    /// The fixed producer's offered rate, jobs/s.
    pub offered_rate: Option<u64>,
    /// The measured window (the producer's time less the warm-up), s.
    pub seconds: f64,
    /// Jobs enqueued in the window.
    pub enqueued: u64,
    /// Jobs whose effect committed in the window.
    pub completed: u64,
    /// Completed jobs per second of the window.
    pub jobs_per_second: Option<f64>,
    /// Enqueue call to handler start, ms.
    pub pickup_p50_ms: Option<f64>,
    /// The same, 99th percentile.
    pub pickup_p99_ms: Option<f64>,
    /// Most dead tuples of the system's tables seen at once.
    pub peak_dead_tuples: Option<i64>,
    /// Largest size of the system's tables seen, bytes.
    pub peak_table_bytes: Option<i64>,
    /// Effect rows beyond one per job.
    pub duplicates: Option<i64>,
    /// Leased mode: repeated receiver calls its key absorbed.
    pub absorbed_repeats: Option<i64>,
    /// Jobs handled by the end of the case over jobs enqueued: below 1, some
    /// were never picked up (a pickup percentile counts only jobs that
    /// started).
    #[serde(default)]
    pub handled_share: Option<f64>,
    /// Transactions in the case's database per job handled, from the
    /// workers' start to their stop (enqueues, claims, completions, the
    /// system's upkeep; the bench's own sampling excluded).
    #[serde(default)]
    pub transactions_per_job: Option<f64>,
    /// Rows inserted, updated or deleted per job handled (the job's effect
    /// row included, one for every system).
    #[serde(default)]
    pub row_writes_per_job: Option<f64>,
    /// The system's version.
    pub version: String,
    /// The system's settings, in words.
    pub settings: String,
    /// What else the system reported.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The system's tables, every sample.
    pub series: Vec<TableSample>,
    /// Why the case failed, when it did.
    pub error: Option<String>,
}

impl ContinuousCase {
    /// An empty result for a case.
    pub fn new(spec: &CaseSpec, opts: &ContinuousOptions) -> ContinuousCase {
        let offered_rate = (spec.producer == Producer::Fixed).then_some(opts.rate);
        ContinuousCase::blank(spec.system.name(), spec.producer, spec.workers, spec.run, offered_rate)
    }

    /// A case of `system` with nothing measured yet.
    fn blank(system: String, producer: Producer, workers: u32, run: u32, offered_rate: Option<u64>) -> ContinuousCase {
        ContinuousCase {
            system,
            producer,
            workers,
            run,
            offered_rate,
            seconds: 0.0,
            enqueued: 0,
            completed: 0,
            jobs_per_second: None,
            pickup_p50_ms: None,
            pickup_p99_ms: None,
            peak_dead_tuples: None,
            peak_table_bytes: None,
            duplicates: None,
            absorbed_repeats: None,
            handled_share: None,
            transactions_per_job: None,
            row_writes_per_job: None,
            version: String::new(),
            settings: String::new(),
            extra: serde_json::Map::new(),
            series: Vec::new(),
            error: None,
        }
    }

    /// Records what the case measured.
    pub fn record(&mut self, produced: u64, seconds: f64, measured: &Measured, described: Described) {
        self.enqueued = described.enqueued.unwrap_or(produced);
        self.seconds = seconds;
        self.completed = measured.completed.max(0) as u64;
        self.jobs_per_second = Some(self.completed as f64 / seconds.max(1e-3));
        self.pickup_p50_ms = measured.pickup_p50_ms;
        self.pickup_p99_ms = measured.pickup_p99_ms;
        self.peak_dead_tuples = self.series.iter().map(|s| s.dead_tuples).max();
        self.peak_table_bytes = self.series.iter().map(|s| s.table_bytes).max();
        self.duplicates = Some(measured.duplicates);
        self.absorbed_repeats = self.system.ends_with("leased").then_some(measured.absorbed);
        self.handled_share = (self.enqueued > 0).then(|| measured.jobs_total as f64 / self.enqueued as f64);
        self.version = described.version;
        self.settings = described.settings;
        self.extra = described.extra;
    }

    /// Records what the database did per job handled.
    pub fn record_db_work(&mut self, before: DbWork, after: DbWork, jobs: i64) {
        if jobs <= 0 {
            return;
        }
        let sampler = self.series.len() as f64;
        let transactions = (after.transactions - before.transactions) as f64 - sampler;
        self.transactions_per_job = Some(transactions.max(0.0) / jobs as f64);
        self.row_writes_per_job = Some((after.row_writes - before.row_writes) as f64 / jobs as f64);
    }

    /// One line for the progress output.
    pub fn summary(&self) -> String {
        let head = format!(
            "{} {} W={} run {}",
            self.system,
            self.producer.name(),
            self.workers,
            self.run
        );
        match &self.error {
            Some(err) => format!("{head}: FAILED: {err}"),
            None => format!(
                "{head}: {:.0} jobs/s, pickup p50 {} p99 {} ms, peak dead tuples {}, duplicates {}",
                self.jobs_per_second.unwrap_or(0.0),
                ms(self.pickup_p50_ms),
                ms(self.pickup_p99_ms),
                self.peak_dead_tuples.unwrap_or(0),
                self.duplicates.unwrap_or(0)
            ),
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ContinuousReport {
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// settled's version.
    pub settled_version: String,
    /// PostgreSQL's version.
    pub server_version: String,
    /// CPUs of the machine.
    pub cpus: usize,
    /// `/proc/loadavg` when the run started and ended (other builders share the machine).
    pub load_average_start: String,
    /// `/proc/loadavg` when the run ended.
    pub load_average_end: String,
    /// The options the run had.
    pub options: ContinuousOptions,
    /// Every case, in the order run.
    pub cases: Vec<ContinuousCase>,
    /// Systems skipped, and why.
    pub skipped: Vec<String>,
    /// The targets, judged.
    pub targets: Vec<String>,
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

impl ContinuousReport {
    /// An empty report, stamped now.
    pub async fn start(opts: &ContinuousOptions, admin_url: &str) -> anyhow::Result<ContinuousReport> {
        let mut admin = PgConnection::connect(admin_url).await?;
        let server_version: String = sqlx::query_scalar("SELECT version()").fetch_one(&mut admin).await?;
        admin.close().await?;
        Ok(ContinuousReport {
            started_at: chrono::Utc::now().to_rfc3339(),
            finished_at: String::new(),
            settled_version: env!("CARGO_PKG_VERSION").into(),
            server_version,
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            load_average_start: load_average(),
            load_average_end: String::new(),
            options: opts.clone(),
            cases: Vec::new(),
            skipped: Vec::new(),
            targets: Vec::new(),
        })
    }

    /// Stamps the end and judges the targets.
    pub fn finish(&mut self) {
        self.finished_at = chrono::Utc::now().to_rfc3339();
        self.load_average_end = load_average();
        self.judge();
    }

    /// Judges the targets on the cases.
    pub fn judge(&mut self) {
        self.targets = targets(&medians(&self.cases), &self.cases);
    }

    /// Reads earlier reports: a later file's cases replace the earlier
    /// files' cases of the same system (to repeat one system's cases).
    pub fn merge(files: &[std::path::PathBuf]) -> anyhow::Result<ContinuousReport> {
        let mut merged: Option<ContinuousReport> = None;
        for file in files {
            let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            let next: ContinuousReport = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a settled bench --continuous report", file.display()))?;
            merged = Some(match merged {
                None => next,
                Some(mut report) => {
                    let systems: std::collections::BTreeSet<&String> = next.cases.iter().map(|c| &c.system).collect();
                    report.cases.retain(|c| !systems.contains(&c.system));
                    report.cases.extend(next.cases.iter().cloned());
                    report.skipped.extend(next.skipped.iter().cloned());
                    report.finished_at = next.finished_at.clone();
                    report.load_average_end = next.load_average_end.clone();
                    report
                }
            });
        }
        let mut report = merged.context("give at least one report")?;
        report.judge();
        Ok(report)
    }

    /// True when every case ran.
    pub fn ok(&self) -> bool {
        self.cases.iter().all(|c| c.error.is_none())
    }
}
