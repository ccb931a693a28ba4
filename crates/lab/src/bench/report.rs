//! Results of `settled bench`: one row per case, the targets, and their
//! markdown and JSON renderings.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

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

/// A target of the issue, and the figure measured for it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// What is asked.
    pub target: String,
    /// What was measured (None: not measured in this run).
    pub figure: Option<f64>,
    /// The figure in words, with what it was computed from.
    pub detail: String,
    /// Whether it is met.
    pub met: Option<bool>,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BenchReport {
    pub started_at: String,
    pub finished_at: String,
    pub settled_version: String,
    pub server_version: String,
    pub server: String,
    pub cpus: usize,
    pub options: BenchOptions,
    pub cases: Vec<CaseResult>,
    pub targets: Vec<Target>,
    pub skipped: Vec<String>,
}

/// Fills each case's scaling efficiency from the W=1 case of its series.
pub fn fill_efficiency(cases: &mut [CaseResult]) {
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

fn find<'a>(cases: &'a [CaseResult], kind: &str, name: &str, workers: u32, work_ms: u64) -> Option<&'a CaseResult> {
    cases
        .iter()
        .find(|c| c.kind == kind && c.name == name && c.workers == workers && c.work_ms == work_ms)
}

/// The four targets, computed from the cases.
pub fn targets(cases: &[CaseResult], opts: &BenchOptions) -> Vec<Target> {
    let mut out = Vec::new();
    let max_w = opts.workers.iter().copied().max().unwrap_or(1);

    // 1. skip-locked-chunk vs the pgbench floor at the same W.
    let ratios: Vec<(u32, f64)> = opts
        .workers
        .iter()
        .filter_map(|&w| {
            let ours = find(cases, "strategy", "skip-locked-chunk", w, 0)?.rate()?;
            let floor = find(cases, "pgbench", "pgbench", w, 0)?.rate()?;
            Some((w, ours / floor))
        })
        .collect();
    out.push(ratio_target(
        "skip-locked-chunk / pgbench floor at the same W, work 0 ms: 0.9 or more",
        &ratios,
        0.9,
        true,
    ));

    // 2a. leased scaling at the largest W with simulated work.
    let work = opts.work_ms.iter().copied().filter(|&m| m > 0).max();
    let leased = work.and_then(|m| find(cases, "strategy", "skip-locked-leased", max_w, m));
    out.push(Target {
        target: format!(
            "skip-locked-leased scaling efficiency at W={max_w}, work {} ms: 0.85 or more",
            work.unwrap_or(0)
        ),
        figure: leased.and_then(|c| c.efficiency),
        detail: leased
            .and_then(|c| {
                c.efficiency.map(|e| {
                    format!(
                        "{e:.3} ({} creators/s)",
                        thousands(c.creators_per_second.unwrap_or_default())
                    )
                })
            })
            .unwrap_or_else(|| "not measured".into()),
        met: leased.and_then(|c| c.efficiency).map(|e| e >= 0.85),
    });
    // 2b. global locks stay near one worker.
    for name in ["redis-lock", "advisory-lock"] {
        let ratio = work.and_then(|m| {
            let one = find(cases, "strategy", name, 1, m)?.rate()?;
            let many = find(cases, "strategy", name, max_w, m)?.rate()?;
            Some(many / one)
        });
        out.push(Target {
            target: format!(
                "{name} throughput at W={max_w} / W=1, work {} ms: 1.2 or less",
                work.unwrap_or(0)
            ),
            figure: ratio,
            detail: ratio
                .map(|r| format!("{r:.3}"))
                .unwrap_or_else(|| "not measured".into()),
            met: ratio.map(|r| r <= 1.2),
        });
    }

    // 3a. skip-locked-chunk vs the fastest peer at the same W.
    let peer_ratios: Vec<(u32, f64)> = opts
        .workers
        .iter()
        .filter_map(|&w| {
            let ours = find(cases, "strategy", "skip-locked-chunk", w, 0)?.rate()?;
            let best = cases
                .iter()
                .filter(|c| c.kind == "peer" && c.workers == w)
                .filter_map(CaseResult::rate)
                .reduce(f64::max)?;
            Some((w, ours / best))
        })
        .collect();
    out.push(ratio_target(
        "skip-locked-chunk / fastest peer at the same W: 3 or more",
        &peer_ratios,
        3.0,
        true,
    ));
    // 3b. skip-locked-chunk at W=4 vs the set-based floor.
    let set_based = cases.iter().find(|c| c.kind == "set-based").and_then(CaseResult::rate);
    let at4 = find(cases, "strategy", "skip-locked-chunk", 4, 0).and_then(CaseResult::rate);
    let ratio = at4.zip(set_based).map(|(a, b)| a / b);
    out.push(Target {
        target: "skip-locked-chunk at W=4 / set-based single transaction: 0.8 or more".into(),
        figure: ratio,
        detail: match (at4, set_based) {
            (Some(a), Some(b)) => format!("{:.3} ({} vs {} creators/s)", a / b, thousands(a), thousands(b)),
            _ => "not measured".into(),
        },
        met: ratio.map(|r| r >= 0.8),
    });

    // 4. worker memory.
    let memory = cases.iter().find(|c| c.kind == "memory");
    let peak = memory.and_then(|c| c.peak_rss_mib);
    out.push(Target {
        target: format!(
            "peak RSS of one worker process at concurrency {}: under 50 MB",
            opts.memory_concurrency
        ),
        figure: peak,
        detail: peak
            .map(|m| format!("{m:.1} MiB ({:.1} MB)", m * 1.048_576))
            .unwrap_or_else(|| "not measured".into()),
        met: peak.map(|m| m * 1.048_576 < 50.0),
    });
    out
}

fn ratio_target(target: &str, ratios: &[(u32, f64)], bound: f64, at_least: bool) -> Target {
    if ratios.is_empty() {
        return Target {
            target: target.into(),
            figure: None,
            detail: "not measured".into(),
            met: None,
        };
    }
    let worst = ratios
        .iter()
        .map(|&(_, r)| r)
        .reduce(if at_least { f64::min } else { f64::max })
        .unwrap_or_default();
    Target {
        target: target.into(),
        figure: Some(worst),
        detail: format!(
            "worst {worst:.3}; by W: {}",
            ratios
                .iter()
                .map(|(w, r)| format!("W={w} {r:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        met: Some(if at_least { worst >= bound } else { worst <= bound }),
    }
}

/// `1234567.8` as `1,234,568`.
pub fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_else(|| "-".into())
}

/// The report as markdown.
pub fn markdown(r: &BenchReport) -> String {
    let mut md = String::new();
    let o = &r.options;
    let _ = writeln!(md, "## settled bench results\n");
    let _ = writeln!(md, "- command: `{}`", o.command);
    let _ = writeln!(md, "- run: {} .. {}", r.started_at, r.finished_at);
    let _ = writeln!(md, "- settled {}; {}", r.settled_version, r.server_version);
    let _ = writeln!(md, "- server: {}; {} CPUs seen by settled", r.server, r.cpus);
    let _ = writeln!(
        md,
        "- N = {} creators without simulated work (chunk {}), {} with it (chunk {}); one fresh database per case; every case verified\n",
        thousands(o.creators as f64),
        o.chunk,
        thousands(o.work_creators as f64),
        o.work_chunk
    );
    let _ = writeln!(md, "### Targets\n");
    let _ = writeln!(md, "| target | measured | met |");
    let _ = writeln!(md, "|---|---|---|");
    for t in &r.targets {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let _ = writeln!(md, "| {} | {} | {met} |", t.target, t.detail);
    }
    for &work in &o.work_ms {
        let _ = writeln!(md, "\n### Strategies, work {work} ms per item\n");
        let _ = writeln!(
            md,
            "| strategy | W | creators/s | efficiency | claim p50 ms | claim p99 ms | claims | waiting on locks (avg / max / share of samples) | tx per item | client CPU s | verify | peak RSS MiB |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for c in r.cases.iter().filter(|c| c.kind == "strategy" && c.work_ms == work) {
            row(&mut md, c);
        }
    }
    let floors: Vec<&CaseResult> = r
        .cases
        .iter()
        .filter(|c| c.kind == "pgbench" || c.kind == "set-based")
        .collect();
    if !floors.is_empty() {
        let _ = writeln!(md, "\n### Floors (work 0 ms)\n");
        let _ = writeln!(
            md,
            "| floor | W | creators/s | skip-locked-chunk at the same W | ratio | tx per item | client CPU s | verify |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for c in floors {
            let ours = find(&r.cases, "strategy", "skip-locked-chunk", c.workers, 0).and_then(CaseResult::rate);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                c.name,
                c.workers,
                c.rate().map(thousands).unwrap_or_else(|| fail(c)),
                ours.map(thousands).unwrap_or_else(|| "-".into()),
                ours.zip(c.rate())
                    .map(|(a, b)| format!("{:.3}", a / b))
                    .unwrap_or_else(|| "-".into()),
                opt(c.transactions_per_item, 3),
                opt(c.client_cpu_seconds, 2),
                if c.verified { "ok" } else { "FAILED" }
            );
        }
    }
    let peers: Vec<&CaseResult> = r.cases.iter().filter(|c| c.kind == "peer").collect();
    if !peers.is_empty() {
        let _ = writeln!(md, "\n### Peers (work 0 ms, enqueue included)\n");
        let _ = writeln!(
            md,
            "| peer | settings | W | creators/s | enqueue s | total s | skip-locked-chunk / peer | verify |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for c in peers {
            let ours = find(&r.cases, "strategy", "skip-locked-chunk", c.workers, 0).and_then(CaseResult::rate);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                c.name,
                c.config.as_deref().unwrap_or("-"),
                c.workers,
                c.rate()
                    .map(|r| format!("{}{}", thousands(r), c.partial_note()))
                    .unwrap_or_else(|| fail(c)),
                c.extra
                    .get("enqueue_seconds")
                    .and_then(|v| v.as_f64())
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "-".into()),
                opt(c.seconds, 2),
                ours.zip(c.rate())
                    .map(|(a, b)| format!("{:.1}x", a / b))
                    .unwrap_or_else(|| "-".into()),
                if c.verified { "ok" } else { "FAILED" }
            );
        }
        let mut versions: BTreeMap<String, String> = BTreeMap::new();
        for c in r.cases.iter().filter(|c| c.kind == "peer") {
            if let Some(v) = c.extra.get("version").and_then(|v| v.as_str()) {
                versions.insert(c.name.clone(), v.to_string());
            }
        }
        if !versions.is_empty() {
            let _ = writeln!(
                md,
                "\nPeer versions: {}",
                versions
                    .iter()
                    .map(|(p, v)| format!("{p} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if let Some(m) = r.cases.iter().find(|c| c.kind == "memory") {
        let _ = writeln!(
            md,
            "\n### Worker memory\n\nOne `skip-locked-chunk` worker process with {} claim loops, N = {}: peak RSS {} MiB, {} creators/s, verify {}.",
            m.concurrency,
            thousands(m.creators as f64),
            opt(m.peak_rss_mib, 1),
            m.rate().map(thousands).unwrap_or_else(|| fail(m)),
            if m.verified { "ok" } else { "FAILED" }
        );
    }
    if !r.skipped.is_empty() {
        let _ = writeln!(md, "\n### Skipped\n");
        for s in &r.skipped {
            let _ = writeln!(md, "- {s}");
        }
    }
    let failed: Vec<&CaseResult> = r.cases.iter().filter(|c| !c.ok()).collect();
    if !failed.is_empty() {
        let _ = writeln!(md, "\n### Failed cases\n");
        for c in failed {
            let _ = writeln!(md, "- {}", c.summary());
        }
    }
    md
}

fn fail(c: &CaseResult) -> String {
    if c.error.is_some() || !c.verified {
        "FAILED".into()
    } else {
        "-".into()
    }
}

fn row(md: &mut String, c: &CaseResult) {
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} | {} | {} | {} |",
        c.name,
        c.workers,
        c.rate().map(thousands).unwrap_or_else(|| fail(c)),
        opt(c.efficiency, 2),
        opt(c.claim_p50_ms, 2),
        opt(c.claim_p99_ms, 2),
        c.claims.map(|n| thousands(n as f64)).unwrap_or_else(|| "-".into()),
        opt(c.lock_waiting_avg, 2),
        c.lock_waiting_max.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
        c.lock_wait_share
            .map(|s| format!("{:.0}%", s * 100.0))
            .unwrap_or_else(|| "-".into()),
        opt(c.transactions_per_item, 3),
        opt(c.client_cpu_seconds, 2),
        if c.verified { "ok" } else { "FAILED" },
        opt(c.peak_rss_mib, 1)
    );
}

/// Writes results.json and results.md into `dir`.
pub fn write(r: &BenchReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(r)?)
        .with_context(|| format!("writing {}", dir.join("results.json").display()))?;
    std::fs::write(dir.join("results.md"), markdown(r))
        .with_context(|| format!("writing {}", dir.join("results.md").display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
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
            work_chunk: 10,
            redis_url: String::new(),
            peers: vec![],
            peers_dir: "bench/peers".into(),
            peer_time_limit: 60,
            floors: true,
            memory_concurrency: 16,
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
