//! The markdown rendering of a bench run.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use super::report::{BenchReport, CaseResult};
use super::targets::find;

/// `1234567.8` as `1,234,568`.
pub(super) fn thousands(v: f64) -> String {
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
