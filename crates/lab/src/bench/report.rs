//! Results of `settled bench`: one row per case, the whole run, and where
//! they are written. The targets are computed in `targets.rs`, the markdown
//! is rendered in `markdown.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use super::markdown::{markdown, thousands};
use super::targets::Target;
use super::BenchOptions;

/// One measured case.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CaseResult {
    /// `strategy`, `pgbench`, `set-based`, `peer` or `memory`.
    pub kind: String,
    /// The strategy, floor or peer.
    pub name: String,
    /// A peer's settings (`defaults` or `tuned`).
    pub config: Option<String>,
    /// Worker processes (pgbench: clients; peers: their concurrency).
    pub workers: u32,
    /// Claim loops per worker process.
    pub concurrency: u32,
    /// Simulated work per item, ms.
    pub work_ms: u64,
    /// Creators settled.
    pub creators: u64,
    /// Items per claim.
    pub chunk: Option<u32>,
    /// Wall time of the settlement (peers: enqueue included).
    pub seconds: Option<f64>,
    /// Creators per second over that time.
    pub creators_per_second: Option<f64>,
    /// Throughput at W / (W x throughput at 1) of the same strategy.
    pub efficiency: Option<f64>,
    /// Claim statements sent, all workers.
    pub claims: Option<u64>,
    /// Median claim latency, ms.
    pub claim_p50_ms: Option<f64>,
    /// 99th percentile claim latency, ms.
    pub claim_p99_ms: Option<f64>,
    /// Mean number of sessions waiting on a lock (pg_stat_activity samples).
    pub lock_waiting_avg: Option<f64>,
    /// Most sessions seen waiting on a lock at once.
    pub lock_waiting_max: Option<u64>,
    /// Share of samples with at least one session waiting on a lock.
    pub lock_wait_share: Option<f64>,
    /// Waiting sessions summed over samples, by wait event (transactionid, tuple, advisory...).
    pub lock_wait_events: BTreeMap<String, u64>,
    /// Transactions in the case's database per creator (pg_stat_database).
    pub transactions_per_item: Option<f64>,
    /// `settled verify` passed.
    pub verified: bool,
    /// Peak resident set size of the largest worker process, MiB.
    pub peak_rss_mib: Option<f64>,
    /// CPU seconds (user + system) used by the case's client processes
    /// (bench workers, pgbench, or the peer); PostgreSQL's own is not included.
    #[serde(default)]
    pub client_cpu_seconds: Option<f64>,
    /// Why the case failed.
    pub error: Option<String>,
    /// Strategy-specific figures.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl CaseResult {
    /// An empty result for a case.
    pub fn new(kind: &str, name: &str, workers: u32, work_ms: u64, creators: u64) -> CaseResult {
        CaseResult {
            kind: kind.into(),
            name: name.into(),
            config: None,
            workers,
            concurrency: 1,
            work_ms,
            creators,
            chunk: None,
            seconds: None,
            creators_per_second: None,
            efficiency: None,
            claims: None,
            claim_p50_ms: None,
            claim_p99_ms: None,
            lock_waiting_avg: None,
            lock_waiting_max: None,
            lock_wait_share: None,
            lock_wait_events: BTreeMap::new(),
            transactions_per_item: None,
            verified: false,
            peak_rss_mib: None,
            client_cpu_seconds: None,
            error: None,
            extra: serde_json::Map::new(),
        }
    }

    /// Records the wall time (and so the throughput).
    pub fn record_time(&mut self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64().max(1e-6);
        self.seconds = Some(secs);
        self.creators_per_second = Some(self.creators as f64 / secs);
    }

    /// Records verify's result; a failed verify makes the case failed.
    pub fn set_verify(&mut self, report: settled::verify::VerifyReport) {
        self.verified = report.ok;
        if !report.ok {
            let failed: Vec<&str> = report.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
            self.error = Some(format!("verify failed: {}", failed.join(", ")));
        }
    }

    /// Throughput, only when the case succeeded and verified.
    pub fn rate(&self) -> Option<f64> {
        if self.ok() {
            self.creators_per_second
        } else {
            None
        }
    }

    /// Measured and verified.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.verified
    }

    /// The case's label in tables and plots.
    pub fn label(&self) -> String {
        match &self.config {
            Some(config) => format!("{} ({config})", self.name),
            None => self.name.clone(),
        }
    }

    /// ` (partial: k of N settled in the time limit)` for a peer stopped by the limit.
    pub fn partial_note(&self) -> String {
        match self.extra.get("settled").and_then(|v| v.as_u64()) {
            Some(settled) if self.extra.contains_key("partial") => {
                format!(
                    " (partial: {} of {} settled in the time limit)",
                    thousands(settled as f64),
                    thousands(self.creators as f64)
                )
            }
            _ => String::new(),
        }
    }

    /// One line for the log.
    pub fn summary(&self) -> String {
        let what = format!(
            "{} {} W={}{} work={}ms N={}",
            self.kind,
            self.label(),
            self.workers,
            if self.concurrency > 1 {
                format!("x{}", self.concurrency)
            } else {
                String::new()
            },
            self.work_ms,
            self.creators
        );
        match (&self.error, self.creators_per_second) {
            (Some(err), _) => format!("{what}: FAILED: {err}"),
            (None, Some(rate)) => format!(
                "{what}: {} creators/s in {:.2} s{}{}, verify {}{}",
                thousands(rate),
                self.seconds.unwrap_or_default(),
                self.partial_note(),
                match (self.claim_p50_ms, self.claim_p99_ms) {
                    (Some(p50), Some(p99)) => format!(", claim p50 {p50:.2} p99 {p99:.2} ms"),
                    _ => String::new(),
                },
                if self.verified { "ok" } else { "FAILED" },
                self.peak_rss_mib
                    .map(|m| format!(", peak RSS {m:.1} MiB"))
                    .unwrap_or_default()
            ),
            (None, None) => format!("{what}: no result"),
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BenchReport {
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// settled's version.
    pub settled_version: String,
    /// PostgreSQL's version.
    pub server_version: String,
    /// Which server: the private one, or the URL's host.
    pub server: String,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The options the run had.
    pub options: BenchOptions,
    /// Every case, in the order run.
    pub cases: Vec<CaseResult>,
    /// The targets, judged.
    pub targets: Vec<Target>,
    /// Cases skipped, and why.
    pub skipped: Vec<String>,
}

/// Fills each case's scaling efficiency from the W=1 case of its series.
pub(super) fn fill_efficiency(cases: &mut [CaseResult]) {
    let base: BTreeMap<(String, String, Option<String>, u64), f64> = cases
        .iter()
        .filter(|c| c.workers == 1 && c.kind != "memory")
        .filter_map(|c| {
            c.rate()
                .map(|r| ((c.kind.clone(), c.name.clone(), c.config.clone(), c.work_ms), r))
        })
        .collect();
    for case in cases.iter_mut() {
        let key = (case.kind.clone(), case.name.clone(), case.config.clone(), case.work_ms);
        if let (Some(one), Some(rate)) = (base.get(&key), case.rate()) {
            case.efficiency = Some(rate / (f64::from(case.workers) * one));
        }
    }
}

/// Writes results.json and results.md into `dir`.
pub(super) fn write(r: &BenchReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(r)?)
        .with_context(|| format!("writing {}", dir.join("results.json").display()))?;
    std::fs::write(dir.join("results.md"), markdown(r))
        .with_context(|| format!("writing {}", dir.join("results.md").display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::markdown::thousands;
    use super::super::targets::targets;
    use super::*;

    fn case(kind: &str, name: &str, workers: u32, work_ms: u64, rate: f64) -> CaseResult {
        let mut c = CaseResult::new(kind, name, workers, work_ms, 1000);
        c.creators_per_second = Some(rate);
        c.seconds = Some(1000.0 / rate);
        c.verified = true;
        c
    }

    fn opts() -> BenchOptions {
        BenchOptions {
            creators: 1000,
            work_creators: 100,
            workers: vec![1, 4],
            work_ms: vec![0, 5],
            strategies: super::super::Strategy::ALL.to_vec(),
            chunk: 1000,
            concurrency: 1,
            work_chunk: 10,
            redis_url: String::new(),
            peers: vec![],
            peers_dir: "bench/peers".into(),
            peer_time_limit: 60,
            floors: true,
            memory_concurrency: 16,
            days: None,
            retain_days: 7,
            held_xmin: false,
            pairs: None,
            balance_fillfactor: None,
            out: None,
            database_url: None,
            command: "settled bench".into(),
        }
    }

    #[test]
    fn efficiency_is_relative_to_one_worker_of_the_same_series() {
        let mut cases = vec![
            case("strategy", "skip-locked-leased", 1, 5, 100.0),
            case("strategy", "skip-locked-leased", 4, 5, 360.0),
            case("strategy", "redis-lock", 1, 5, 100.0),
            case("strategy", "redis-lock", 4, 5, 101.0),
            case("strategy", "redis-lock", 4, 0, 900.0),
        ];
        fill_efficiency(&mut cases);
        assert_eq!(cases[1].efficiency, Some(0.9));
        assert!((cases[3].efficiency.unwrap() - 0.2525).abs() < 1e-9);
        // No W=1 case at work 0: no efficiency rather than a wrong one.
        assert_eq!(cases[4].efficiency, None);
    }

    #[test]
    fn a_case_that_fails_verify_is_failed_not_fast() {
        let mut c = case("strategy", "offset", 4, 0, 1e9);
        c.set_verify(settled::verify::VerifyReport {
            period: "2026-11-28".into(),
            ok: false,
            ledger_total: "0".into(),
            expected_total: "1".into(),
            checks: vec![],
            seconds: 0.0,
        });
        assert!(!c.ok());
        assert_eq!(c.rate(), None);
        assert!(c.error.as_deref().unwrap().starts_with("verify failed"));
        let report = BenchReport {
            started_at: String::new(),
            finished_at: String::new(),
            settled_version: String::new(),
            server_version: String::new(),
            server: String::new(),
            cpus: 2,
            options: opts(),
            cases: vec![c],
            targets: vec![],
            skipped: vec![],
        };
        let md = markdown(&report);
        assert!(md.contains("| offset | 4 | FAILED |"), "{md}");
        assert!(md.contains("### Failed cases"), "{md}");
    }

    #[test]
    fn targets_use_the_worst_worker_count_and_say_when_unmeasured() {
        let mut cases = vec![
            case("strategy", "skip-locked-chunk", 1, 0, 950.0),
            case("strategy", "skip-locked-chunk", 4, 0, 1700.0),
            case("pgbench", "pgbench", 1, 0, 1000.0),
            case("pgbench", "pgbench", 4, 0, 2000.0),
            case("set-based", "set-based", 1, 0, 2000.0),
            case("strategy", "skip-locked-leased", 1, 5, 100.0),
            case("strategy", "skip-locked-leased", 4, 5, 380.0),
            case("strategy", "advisory-lock", 1, 5, 100.0),
            case("strategy", "advisory-lock", 4, 5, 130.0),
        ];
        fill_efficiency(&mut cases);
        let t = targets(&cases, &opts());
        assert_eq!(t[0].figure, Some(0.85));
        assert_eq!(t[0].met, Some(false));
        assert_eq!(t[1].figure, Some(0.95));
        assert_eq!(t[1].met, Some(true));
        assert_eq!(t[2].met, None, "redis-lock was not measured");
        assert_eq!(t[3].met, Some(false), "advisory-lock at 1.3x");
        assert_eq!(t[4].met, None, "no peers");
        assert_eq!(t[5].figure, Some(0.85));
        assert_eq!(t[6].met, None, "no memory case");
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }
}
