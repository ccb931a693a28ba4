//! The dashboard's pages as maud templates: every interpolated value is
//! escaped by the template engine; nothing here touches the database.

use maud::{html, Markup, PreEscaped, DOCTYPE};
use settled_engine::raw::workers::WorkerRow;

use super::queries::{ItemRow, LockRow, RunProgress, Second};
use super::Verified;

/// Seconds between refreshes of live pages.
pub const REFRESH_SECS: u32 = 2;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222} nav a{margin-right:1em}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;font-size:.9em}
th{background:#f3f3f3} .bar{width:260px;height:14px;background:#eee;display:inline-block;vertical-align:middle}
.bar span{display:block;height:14px;background:#2a7} .waiting{background:#fdd} .mono{font-family:monospace}
.ok{color:#080} .fail{color:#b00} td.mono{max-width:22em;word-break:break-all}";

/// The page frame: navigation, title, optional refresh.
pub(super) fn page(title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                @if refresh { meta http-equiv="refresh" content=(REFRESH_SECS); }
                title { "settled: " (title) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                nav {
                    b { "settled" } " "
                    a href="/" { "runs" }
                    a href="/workers" { "workers" }
                    a href="/items?status=failed" { "failed" }
                    a href="/items?status=held" { "held" }
                    a href="/payouts" { "payouts" }
                    a href="/queues" { "queues" }
                    a href="/locks" { "locks" }
                    a href="/metrics" { "metrics" }
                }
                h1 { (title) }
                (body)
            }
        }
    }
}

fn progress_bar(done: i64, total: i64) -> Markup {
    let pct = if total == 0 {
        100.0
    } else {
        done as f64 * 100.0 / total as f64
    };
    html! {
        span.bar data-done=(done) data-total=(total) { span style=(format!("width:{pct:.1}%")) {} }
        " " (done) "/" (total) " (" (format!("{pct:.1}")) "%)"
    }
}

/// An inline SVG bar chart of settled items per second.
pub(super) fn chart(points: &[Second]) -> Markup {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return html! { p { "no payments yet" } };
    };
    let (w, h) = (600.0, 120.0);
    let span = (last.at - first.at).max(1.0) + 1.0;
    let max = points.iter().map(|p| p.settled).max().unwrap_or(1).max(1) as f64;
    let bar_w = (w / span).max(1.0);
    html! {
        svg width=(w) height=(h + 16.0) role="img" aria-label="settled per second" {
            @for p in points {
                @let bh = p.settled as f64 / max * h;
                rect x=(format!("{:.1}", (p.at - first.at) / span * w)) y=(format!("{:.1}", h - bh))
                    width=(format!("{bar_w:.1}")) height=(format!("{bh:.1}")) fill="#2a7" {}
            }
            text x="0" y=(h + 14.0) font-size="11" { "peak " (max) " settled/s over " (format!("{span:.0}")) " s" }
        }
    }
}

/// The front page: runs with progress, amounts and ETA; the live run's chart.
pub(super) fn runs(runs: &[(RunProgress, String)], live: Option<(i64, &[Second])>, decimals: u32) -> Markup {
    let body = html! {
        table {
            tr { th { "run" } th { "period" } th { "state" } th { "starter" } th { "started (UTC)" } th { "finished" }
                 th { "progress" } th { "settled / failed / held" } th { "paid (tokens)" } th { "paid (base units)" } th { "ETA" } }
            @for (p, eta) in runs {
                tr {
                    td { a href=(format!("/runs/{}", p.run.id)) { (p.run.id) } }
                    td { (p.run.scope) }
                    td { (p.run.state.as_str()) }
                    td.mono { (p.run.started_by.map(|u| u.simple().to_string()[..8].to_string()).unwrap_or_else(|| "operator".into())) }
                    td { (p.run.started_at.format("%Y-%m-%d %H:%M:%S")) }
                    td { (p.run.finished_at.map(|f| f.format("%H:%M:%S").to_string()).unwrap_or_else(|| "-".into())) }
                    td { (progress_bar(p.done, p.total)) }
                    td { (p.settled) " / " (p.failed) " / " (p.held) }
                    td.mono.tokens { (crate::money::tokens(&p.paid, decimals)) }
                    td.mono { (p.paid) }
                    td { (eta) }
                }
            }
        }
        @if runs.is_empty() { p { "No runs yet." } }
        p.note { "Tokens are base units with " (decimals) " decimals (--token-decimals)." }
        @if let Some((id, points)) = live {
            h2 { "run " (id) ": settled per second" }
            (chart(points))
        }
    };
    page("runs", true, body)
}

/// A run's report: its verification, its chart, its stored report.
pub(super) fn run_report(
    id: i64,
    period: &str,
    state: &str,
    verified: &Verified,
    points: &[Second],
    report: Option<&serde_json::Value>,
) -> Markup {
    let body = html! {
        p { "period " (period) " · state " (state) }
        @if let Some(report) = report {
            h2 { "stored report" }
            pre { (serde_json::to_string_pretty(report).unwrap_or_default()) }
        }
        @match &verified.result {
            Ok(v) => {
                h2 { "verification: " span class=(if v.ok { "ok" } else { "fail" }) { (if v.ok { "every check holds" } else { "FAILED" }) } }
                p.note { "computed " (verified.at.elapsed().as_secs()) " s ago; shared by every page, at most " (super::VERIFY_INTERVAL.as_secs()) " s old" }
                table {
                    tr { th { "check" } th { "result" } th { "offenders" } }
                    @for c in &v.checks {
                        tr {
                            td { (c.description) }
                            td class=(if c.ok { "ok" } else { "fail" }) { (if c.ok { "ok" } else { "FAIL" }) }
                            td { (c.offenders.join("; ")) }
                        }
                    }
                }
                p { "ledger total " (v.ledger_total) " · expected " (v.expected_total) }
            }
            Err(e) => { p.fail { "verification could not run: " (e) } }
        }
        (chart(points))
    };
    page(&format!("run {id}"), state == "running", body)
}

/// The worker registry.
pub(super) fn workers(all: &[WorkerRow]) -> Markup {
    let body = html! {
        table {
            tr { th { "worker" } th { "host" } th { "pid" } th { "version" } th { "state" } th { "last heartbeat" }
                 th { "items held" } th { "settled" } th { "failed" } th { "fence rejections" } }
            @for w in all {
                tr {
                    td.mono { (&w.id.simple().to_string()[..8]) }
                    td { (w.host) } td { (w.pid) } td { (w.version) } td { (w.state) }
                    td { (format!("{:.1}", w.heartbeat_age_secs)) " s ago" }
                    td { (w.leases_held) } td { (w.items_settled) } td { (w.items_failed) } td { (w.fence_rejections) }
                }
            }
        }
    };
    page("workers", true, body)
}

/// Failed or held items, with a retry form for failed ones.
pub(super) fn items(status: &str, rows: &[ItemRow]) -> Markup {
    let body = html! {
        table {
            tr { th { "period" } th { "creator" } th { "attempt" } th { "last error" } th {} }
            @for row in rows {
                tr {
                    td { (row.period) }
                    td.mono { (row.creator) }
                    td { (row.attempt) }
                    td { (row.last_error.as_deref().unwrap_or("")) }
                    td {
                        @if status == "failed" {
                            form method="post" action="/dashboard/retry" {
                                input type="hidden" name="period" value=(row.period);
                                input type="hidden" name="creator" value=(row.creator);
                                button { "retry" }
                            }
                        } @else {
                            "release the hold via POST /v1/holds/{id}/release"
                        }
                    }
                }
            }
        }
        @if rows.is_empty() { p { "No " (status) " items." } }
        @if status == "failed" && !rows.is_empty() {
            p.note { "Retry asks for the API token: any user name, the token as the password." }
        }
    };
    page(&format!("{status} items"), false, body)
}

/// The live lock view.
pub(super) fn locks(rows: &[LockRow], whole_queries: bool) -> Markup {
    let waiting = rows.iter().filter(|r| !r.granted).count();
    let body = html! {
        p {
            (rows.len()) " lock(s), " b #waiting data-waiting=(waiting) { (waiting) " waiting" } ". "
            "Row locks taken by SELECT ... FOR UPDATE are not listed one by one by PostgreSQL; a backend blocked on one \
             shows as waiting on a transaction id or tuple."
        }
        @if !whole_queries {
            p.note { "Query literals are shown as ?; send the API token (Authorization: Bearer) to see them." }
        }
        table {
            tr { th { "pid" } th { "application" } th { "lock" } th { "mode" } th { "granted" } th { "on" }
                 th { "waits for" } th { "xact age" } th { "state" } th { "query" } }
            @for r in rows {
                tr class=(if r.granted { "" } else { "waiting" }) {
                    td { (r.pid) }
                    td { (r.application.as_deref().unwrap_or("")) }
                    td { (r.locktype) } td { (r.mode) } td { (r.granted) }
                    td { (r.target.as_deref().unwrap_or("")) }
                    td { (r.blocked_by.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ")) }
                    td { (r.xact_age_secs.map(|a| format!("{a:.1} s")).unwrap_or_default()) }
                    td { (r.state.as_deref().unwrap_or("")) }
                    td.mono { (r.query.as_deref().unwrap_or("")) }
                }
            }
        }
    };
    page("locks", true, body)
}
