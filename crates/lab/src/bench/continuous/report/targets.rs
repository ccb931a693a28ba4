//! The medians over runs and the targets judged on them.

use std::collections::BTreeMap;

use crate::bench::continuous::Producer;

use super::{ContinuousCase, PICKUP_HANDLED_SHARE_MIN, TARGET_THROUGHPUT_RATIO, TARGET_WORKERS};

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

pub(super) fn median(mut xs: Vec<f64>) -> Option<f64> {
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
pub(super) fn targets(medians: &BTreeMap<Key, Median>, cases: &[ContinuousCase]) -> Vec<String> {
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
pub(super) fn peers_at(medians: &BTreeMap<Key, Median>, p: Producer, w: u32) -> Vec<(&String, &Median)> {
    medians
        .iter()
        .filter(|((pp, ww, s), _)| *pp == p && *ww == w && !s.starts_with("settled"))
        .map(|((_, _, s), m)| (s, m))
        .collect()
}

/// Settled-tx's saturated jobs/s against the fastest peer's.
pub(super) fn throughput_target(medians: &BTreeMap<Key, Median>, w: u32) -> Option<String> {
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
pub(super) fn latency_target(medians: &BTreeMap<Key, Median>, w: u32) -> Option<String> {
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

pub(super) fn verdict(met: bool, target: &str) -> String {
    format!("{} ({target})", if met { "met" } else { "MISSED" })
}
