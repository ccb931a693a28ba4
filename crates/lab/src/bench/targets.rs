//! The targets a bench run is held to, computed from its cases.

use super::markdown::thousands;
use super::report::CaseResult;
use super::BenchOptions;

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

pub(super) fn find<'a>(
    cases: &'a [CaseResult],
    kind: &str,
    name: &str,
    workers: u32,
    work_ms: u64,
) -> Option<&'a CaseResult> {
    cases
        .iter()
        .find(|c| c.kind == kind && c.name == name && c.workers == workers && c.work_ms == work_ms)
}

/// From this many creators per case the set-based target is 1.3, not 0.8.
const SET_BASED_RATIO_AT_MILLION_CREATORS: u64 = 1_000_000;

/// The four targets, computed from the cases.
pub(super) fn targets(cases: &[CaseResult], opts: &BenchOptions) -> Vec<Target> {
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
    // 3b. skip-locked-chunk at W=4 vs the set-based floor: at a million
    // creators or more, issue 14's 1.3; below, where starting and finishing
    // a run weigh more, 0.8.
    let set_based = cases.iter().find(|c| c.kind == "set-based").and_then(CaseResult::rate);
    let at4 = find(cases, "strategy", "skip-locked-chunk", 4, 0).and_then(CaseResult::rate);
    let ratio = at4.zip(set_based).map(|(a, b)| a / b);
    let floor = if opts.creators >= SET_BASED_RATIO_AT_MILLION_CREATORS {
        1.3
    } else {
        0.8
    };
    out.push(Target {
        target: format!("skip-locked-chunk at W=4 / set-based single transaction: {floor} or more"),
        figure: ratio,
        detail: match (at4, set_based) {
            (Some(a), Some(b)) => format!("{:.3} ({} vs {} creators/s)", a / b, thousands(a), thousands(b)),
            _ => "not measured".into(),
        },
        met: ratio.map(|r| r >= floor),
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
