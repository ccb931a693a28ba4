//! The report as markdown: the table of medians, the targets, the series
//! and the settings.

use std::collections::BTreeMap;

use crate::bench::continuous::Producer;

use super::targets::medians;
use super::{ContinuousReport, PICKUP_HANDLED_SHARE_MIN, SERIES_CASE_SECS_MIN, SERIES_ROW_SECS};

pub(super) fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

pub(super) fn ratio(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

pub(super) fn count(v: Option<f64>) -> String {
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

pub(super) fn targets_markdown(report: &ContinuousReport) -> String {
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

pub(super) fn series_markdown(report: &ContinuousReport) -> String {
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

pub(super) fn settings_markdown(report: &ContinuousReport) -> String {
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
