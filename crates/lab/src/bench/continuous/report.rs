//! The report of `settled bench --continuous`: one row per case, the
//! medians over runs, the targets and the markdown.

use std::collections::BTreeMap;

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
        ContinuousCase {
            system: spec.system.name(),
            producer: spec.producer,
            workers: spec.workers,
            run: spec.run,
            offered_rate: (spec.producer == Producer::Fixed).then_some(opts.rate),
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

/// The medians of one (system, producer, W) over its runs that ran.
#[derive(Debug, Clone, Default)]
pub(super) struct Median {
    pub runs: usize,
    pub failed: usize,
    pub jobs_per_second: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub dead: Option<f64>,
    pub duplicates: i64,
    pub absorbed: Option<i64>,
    pub transactions_per_job: Option<f64>,
    pub row_writes_per_job: Option<f64>,
    pub handled_share: Option<f64>,
}

impl Median {
    /// The p99 pickup, when the system kept up (None: some jobs never started).
    pub(super) fn comparable_p99(&self) -> Option<f64> {
        self.p99
            .filter(|_| self.handled_share.is_some_and(|s| s >= PICKUP_HANDLED_SHARE_MIN))
    }
}

type Key = (Producer, u32, String);

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// Medians per (producer, W, system), duplicates summed over runs.
pub(super) fn medians(cases: &[ContinuousCase]) -> BTreeMap<Key, Median> {
    let mut groups: BTreeMap<Key, Vec<&ContinuousCase>> = BTreeMap::new();
    for c in cases {
        groups
            .entry((c.producer, c.workers, c.system.clone()))
            .or_default()
            .push(c);
    }
    groups
        .into_iter()
        .map(|(key, cs)| {
            let ok: Vec<&&ContinuousCase> = cs.iter().filter(|c| c.error.is_none()).collect();
            let pick = |f: &dyn Fn(&ContinuousCase) -> Option<f64>| median(ok.iter().filter_map(|c| f(c)).collect());
            let m = Median {
                runs: ok.len(),
                failed: cs.len() - ok.len(),
                jobs_per_second: pick(&|c| c.jobs_per_second),
                p50: pick(&|c| c.pickup_p50_ms),
                p99: pick(&|c| c.pickup_p99_ms),
                dead: pick(&|c| c.peak_dead_tuples.map(|d| d as f64)),
                duplicates: ok.iter().filter_map(|c| c.duplicates).sum(),
                absorbed: ok.iter().map(|c| c.absorbed_repeats).sum(),
                transactions_per_job: pick(&|c| c.transactions_per_job),
                row_writes_per_job: pick(&|c| c.row_writes_per_job),
                handled_share: pick(&|c| c.handled_share),
            };
            (key, m)
        })
        .collect()
}

/// The targets, each a sentence saying met or missed and by how much.
fn targets(medians: &BTreeMap<Key, Median>, cases: &[ContinuousCase]) -> Vec<String> {
    let mut lines = Vec::new();
    for w in TARGET_WORKERS {
        lines.extend(throughput_target(medians, w));
        lines.extend(latency_target(medians, w));
    }
    let dup: i64 = cases
        .iter()
        .filter(|c| c.system == "settled-tx" && c.error.is_none())
        .filter_map(|c| c.duplicates)
        .sum();
    if cases.iter().any(|c| c.system == "settled-tx") {
        lines.push(format!(
            "settled-tx duplicates over every case: {dup}: {}",
            verdict(dup == 0, "target 0")
        ));
    }
    lines
}

/// The peers' medians of one producer and W.
fn peers_at(medians: &BTreeMap<Key, Median>, p: Producer, w: u32) -> Vec<(&String, &Median)> {
    medians
        .iter()
        .filter(|((pp, ww, s), _)| *pp == p && *ww == w && !s.starts_with("settled"))
        .map(|((_, _, s), m)| (s, m))
        .collect()
}

/// Settled-tx's saturated jobs/s against the fastest peer's.
fn throughput_target(medians: &BTreeMap<Key, Median>, w: u32) -> Option<String> {
    let tx = medians
        .get(&(Producer::Saturation, w, "settled-tx".to_string()))?
        .jobs_per_second?;
    let (peer, j) = peers_at(medians, Producer::Saturation, w)
        .into_iter()
        .filter_map(|(s, m)| m.jobs_per_second.map(|j| (s, j)))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let ratio = tx / j.max(1e-9);
    Some(format!(
        "W={w}, saturation: settled-tx {tx:.0} jobs/s is {ratio:.2}x the fastest peer ({peer}, {j:.0}): {}",
        verdict(
            ratio >= TARGET_THROUGHPUT_RATIO,
            &format!("target {TARGET_THROUGHPUT_RATIO}x")
        )
    ))
}

/// Settled-tx's fixed-rate pickup p99 against every peer's; a peer that
/// left jobs unstarted has no p99 to compare.
fn latency_target(medians: &BTreeMap<Key, Median>, w: u32) -> Option<String> {
    let tx = medians
        .get(&(Producer::Fixed, w, "settled-tx".to_string()))?
        .comparable_p99()?;
    let all = peers_at(medians, Producer::Fixed, w);
    if all.is_empty() {
        return None;
    }
    let behind: Vec<&str> = all
        .iter()
        .filter(|(_, m)| m.comparable_p99().is_none())
        .map(|(s, _)| s.as_str())
        .collect();
    let behind = if behind.is_empty() {
        String::new()
    } else {
        format!("; {} left jobs unstarted (their p99 is unbounded)", behind.join(", "))
    };
    let target = "target: lower than every peer";
    Some(
        match all
            .iter()
            .filter_map(|(s, m)| m.comparable_p99().map(|p| (*s, p)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
        {
            Some((peer, best)) => format!(
                "W={w}, fixed rate: settled-tx pickup p99 {tx:.1} ms against the lowest peer's {best:.1} ms ({peer}){behind}: {}",
                verdict(tx < best, target)
            ),
            None => format!("W={w}, fixed rate: settled-tx pickup p99 {tx:.1} ms{behind}: {}", verdict(true, target)),
        },
    )
}

fn verdict(met: bool, target: &str) -> String {
    format!("{} ({target})", if met { "met" } else { "MISSED" })
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn ratio(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

fn count(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

/// The report as markdown.
pub fn markdown(report: &ContinuousReport) -> String {
    let o = &report.options;
    let mut md = format!(
        "## Continuous queues: {} s per case, {} run(s), medians\n\n\
         {} ms of work per job, one effect row per job; fixed producer at {} jobs/s, saturation kept {} deep. \
         A fixed-rate p99 in parentheses counts only the jobs that started: that system handled under {:.0}% of \
         what was enqueued (at saturation the queue is kept deep, so a share below 1 is the backlog). {} CPUs; load average {} at the start, {} at the end. {}\n\n",
        o.seconds,
        o.runs,
        o.work_ms,
        o.rate,
        o.depth,
        PICKUP_HANDLED_SHARE_MIN * 100.0,
        report.cpus,
        report.load_average_start,
        report.load_average_end,
        report.server_version
    );
    let medians = medians(&report.cases);
    for producer in &o.producers {
        md += &format!(
            "### Producer: {}\n\n| system | W | jobs/s | pickup p50 ms | pickup p99 ms | handled/enqueued | peak dead tuples | duplicates | leased repeats absorbed | transactions/job | row writes/job | runs |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            if *producer == Producer::Fixed { format!("fixed {} jobs/s", o.rate) } else { "saturation".into() }
        );
        for ((p, w, system), m) in &medians {
            if p != producer {
                continue;
            }
            md += &format!(
                "| {system} | {w} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} |\n",
                count(m.jobs_per_second),
                ms(m.p50),
                match (*producer, m.comparable_p99()) {
                    (Producer::Fixed, None) => format!("({})", ms(m.p99)),
                    _ => ms(m.p99),
                },
                ratio(m.handled_share),
                count(m.dead),
                m.duplicates,
                m.absorbed.map_or("-".into(), |a| a.to_string()),
                ratio(m.transactions_per_job),
                ratio(m.row_writes_per_job),
                m.runs,
                if m.failed > 0 {
                    format!(" ({} failed)", m.failed)
                } else {
                    String::new()
                }
            );
        }
        md += "\n";
    }
    md += &targets_markdown(report);
    md += &series_markdown(report);
    md += &settings_markdown(report);
    md
}

fn targets_markdown(report: &ContinuousReport) -> String {
    let mut md = String::new();
    if !report.targets.is_empty() {
        md += "### Targets\n\n";
        for t in &report.targets {
            md += &format!("- {t}\n");
        }
        md += "\n";
    }
    for s in &report.skipped {
        md += &format!("- {s}\n");
    }
    for c in report.cases.iter().filter(|c| c.error.is_some()) {
        md += &format!("- failed: {}\n", c.summary());
    }
    md
}

fn series_markdown(report: &ContinuousReport) -> String {
    let mut md = String::new();
    for c in report.cases.iter().filter(|c| c.seconds >= SERIES_CASE_SECS_MIN) {
        md += &format!(
            "### {} {} W={} run {}: its tables over time\n\n| t (s) | dead tuples | live tuples | size (MiB) |\n|---:|---:|---:|---:|\n",
            c.system,
            c.producer.name(),
            c.workers,
            c.run
        );
        let mut next = 0.0;
        for s in &c.series {
            if s.t_s + 1e-9 >= next {
                md += &format!(
                    "| {:.0} | {} | {} | {:.1} |\n",
                    s.t_s,
                    s.dead_tuples,
                    s.live_tuples,
                    s.table_bytes as f64 / 1048576.0
                );
                next += SERIES_ROW_SECS;
            }
        }
        md += "\n";
    }
    md
}

fn settings_markdown(report: &ContinuousReport) -> String {
    let mut seen = BTreeMap::new();
    for c in report.cases.iter().filter(|c| c.error.is_none()) {
        seen.entry(c.system.clone())
            .or_insert_with(|| (c.version.clone(), c.settings.clone()));
    }
    let mut md =
        String::from("### Systems\n\n| system | version | settings (at the first W measured) |\n|---|---|---|\n");
    for (system, (version, settings)) in seen {
        md += &format!("| {system} | {version} | {settings} |\n");
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(system: &str, producer: Producer, jobs: f64, p99: f64, handled: f64) -> ContinuousCase {
        ContinuousCase {
            system: system.into(),
            producer,
            workers: 16,
            run: 1,
            offered_rate: None,
            seconds: 10.0,
            enqueued: 1000,
            completed: 1000,
            jobs_per_second: Some(jobs),
            pickup_p50_ms: Some(p99 / 2.0),
            pickup_p99_ms: Some(p99),
            peak_dead_tuples: Some(0),
            peak_table_bytes: Some(0),
            duplicates: Some(0),
            absorbed_repeats: None,
            handled_share: Some(handled),
            transactions_per_job: None,
            row_writes_per_job: None,
            version: String::new(),
            settings: String::new(),
            extra: serde_json::Map::new(),
            series: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn a_peer_that_left_jobs_unstarted_never_has_the_lowest_p99() {
        let cases = vec![
            case("settled-tx", Producer::Fixed, 500.0, 9.0, 1.0),
            case("quick-but-stuck", Producer::Fixed, 10.0, 2.0, 0.03),
            case("slower", Producer::Fixed, 500.0, 12.0, 1.0),
        ];
        let line = latency_target(&medians(&cases), 16).unwrap();
        assert!(line.contains("lowest peer's 12.0 ms (slower)"), "{line}");
        assert!(line.contains("quick-but-stuck left jobs unstarted"), "{line}");
        assert!(line.ends_with("met (target: lower than every peer)"), "{line}");
        let md = markdown_rows(&cases);
        assert!(md.contains("| quick-but-stuck | 16 | 10 | 1.0 | (2.0) |"), "{md}");
    }

    #[test]
    fn throughput_is_judged_against_the_fastest_peer_on_medians() {
        let cases = vec![
            case("settled-tx", Producer::Saturation, 5000.0, 1.0, 0.9),
            case("settled-tx", Producer::Saturation, 7000.0, 1.0, 0.9),
            case("settled-tx", Producer::Saturation, 6000.0, 1.0, 0.9),
            case("peer", Producer::Saturation, 4000.0, 1.0, 0.9),
        ];
        let line = throughput_target(&medians(&cases), 16).unwrap();
        assert_eq!(
            line,
            "W=16, saturation: settled-tx 6000 jobs/s is 1.50x the fastest peer (peer, 4000): met (target 1.5x)"
        );
    }

    fn markdown_rows(cases: &[ContinuousCase]) -> String {
        let opts = ContinuousOptions {
            settled_modes: Vec::new(),
            peers: Vec::new(),
            peers_dir: "bench/peers".into(),
            workers: vec![16],
            producers: vec![Producer::Fixed],
            rate: 500,
            seconds: 10,
            runs: 1,
            batch: 10,
            depth: 2000,
            retention_secs: 60,
            work_ms: 1,
            database_url: None,
            command: String::new(),
        };
        let report = ContinuousReport {
            started_at: String::new(),
            finished_at: String::new(),
            settled_version: String::new(),
            server_version: String::new(),
            cpus: 2,
            load_average_start: String::new(),
            load_average_end: String::new(),
            options: opts,
            cases: cases.to_vec(),
            skipped: Vec::new(),
            targets: Vec::new(),
        };
        markdown(&report)
    }
}
