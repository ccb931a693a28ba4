//! The dashboard's pages as maud templates: every interpolated value is
//! escaped by the template engine; nothing here touches the database.

use maud::{html, Markup, PreEscaped, DOCTYPE};
use settled_engine::raw::workers::WorkerRow;

use super::queries::{Committed, ItemRow, LockRow, RunProgress, Second};
use super::{Verified, Watch};
use crate::run_state::Shown;
use crate::verify::{Check, VerifyReport};

/// Seconds between refreshes of pages that watch something.
pub(crate) const REFRESH_SECS: u32 = 5;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222} nav a{margin-right:1em}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;font-size:.9em}
th{background:#f3f3f3} .bar{width:260px;height:14px;background:#eee;display:inline-block;vertical-align:middle}
.bar span{display:block;height:14px;background:#2a7} .waiting{background:#fdd} .mono{font-family:monospace}
.ok{color:#080} .fail{color:#b00} .stalled{color:#b60;font-weight:bold} td.mono{max-width:22em;word-break:break-all}
.refresh{float:right;font-size:.85em}";

/// The page frame: navigation, title, and for a page that watches
/// something, its refresh (a meta refresh, no script) and the link that
/// stops or starts it.
pub(super) fn page(title: &str, watch: Option<&Watch>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                @if watch.is_some_and(|w| w.on) { meta http-equiv="refresh" content=(REFRESH_SECS); }
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
                    a href="/chain" { "chain" }
                    a href="/holds" { "holds" }
                    a href="/queues" { "queues" }
                    a href="/locks" { "locks" }
                    a href="/audit" { "audit" }
                    a href="/metrics" { "metrics" }
                    @if let Some(watch) = watch {
                        span.refresh {
                            @if watch.on {
                                "refreshes every " (REFRESH_SECS) " s · " a href=(watch.toggle()) { "stop refreshing" }
                            } @else {
                                a href=(watch.toggle()) { "refresh every " (REFRESH_SECS) " s" }
                            }
                        }
                    }
                }
                h1 { (title) }
                (body)
            }
        }
    }
}

/// An error's page: the status, what went wrong, and the navigation.
pub(super) fn error(status: u16, title: &str, detail: &str) -> Markup {
    let body = html! {
        p.fail { (status) " " (title) }
        p { (detail) }
    };
    page(title, None, body)
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

/// A run on the front page: its progress, its state as read, its ETA.
pub(super) struct ShownRun {
    /// Its progress.
    pub progress: RunProgress,
    /// Its state as read (`stalled` derived).
    pub shown: Shown,
    /// Its ETA, for a running run that advances (`-` otherwise).
    pub eta: String,
}

/// The front page: runs with progress, amounts and ETA; the live run's chart.
pub(super) fn runs(runs: &[ShownRun], live: Option<(i64, &[Second])>, decimals: u32, watch: &Watch) -> Markup {
    let body = html! {
        table {
            tr { th { "run" } th { "period" } th { "state" } th { "starter" } th { "started (UTC)" } th { "finished" }
                 th { "progress" } th { "settled / failed / held" } th { "paid (tokens)" } th { "paid (base units)" } th { "ETA" } }
            @for ShownRun { progress: p, shown, eta } in runs {
                tr {
                    td { a href=(format!("/runs/{}", p.run.id)) { (p.run.id) } }
                    td { (p.run.scope) }
                    (state_cell(shown))
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
        @if runs.iter().any(|r| r.shown.stalled_since().is_some()) { (stalled_note()) }
        p.note { "Tokens are base units with " (decimals) " decimals (--token-decimals)." }
        @if let Some((id, points)) = live {
            h2 { "run " (id) ": settled per second" }
            (chart(points))
        }
    };
    page("runs", Some(watch), body)
}

/// A run's state cell: `stalled since ...` stands out.
fn state_cell(shown: &Shown) -> Markup {
    html! {
        @if shown.stalled_since().is_some() {
            td.stalled data-state=(shown.as_str()) { (shown.label()) }
        } @else {
            td data-state=(shown.as_str()) { (shown.as_str()) }
        }
    }
}

fn stalled_note() -> Markup {
    html! {
        p.stalled {
            "stalled: the run is running but no worker is alive (no heartbeat within "
            (settled_engine::raw::workers::WORKER_DEAD_AFTER_SECS) " s, the rule of the SettledNoLiveWorker alert), \
             so nothing advances it. Start a worker (settled worker); it resumes where the run stands."
        }
    }
}

/// What a run's page shows of a run.
pub(super) struct RunView<'a> {
    /// The run's id.
    pub id: i64,
    /// Its period.
    pub period: &'a str,
    /// Its state as read.
    pub shown: Shown,
    /// (done, total) items, while it runs.
    pub progress: Option<(i64, i64)>,
    /// Its stored report, once finished.
    pub report: Option<&'a serde_json::Value>,
}

/// A run's report: its state and progress, its verification, its chart,
/// its stored report.
pub(super) fn run_report(run: &RunView<'_>, verified: &Verified, points: &[Second], watch: &Watch) -> Markup {
    let in_progress = run.progress.is_some();
    let body = html! {
        p { "period " (run.period) " · state " (run.shown.label()) }
        @if run.shown.stalled_since().is_some() { (stalled_note()) }
        @if let Some((done, total)) = run.progress {
            p { "in progress: " (progress_bar(done, total)) }
        }
        @if let Some(report) = run.report {
            h2 { "stored report" }
            pre { (serde_json::to_string_pretty(report).unwrap_or_default()) }
        }
        @match &verified.result {
            Ok(v) => { (verification(v, in_progress)) p.note { "computed " (verified.at.elapsed().as_secs()) " s ago; shared by every page, at most " (super::VERIFY_INTERVAL.as_secs()) " s old" } }
            Err(e) => { p.fail { "verification could not run: " (e) } }
        }
        (chart(points))
    };
    page(&format!("run {}", run.id), in_progress.then_some(watch), body)
}

/// A verification's checks. While the run is in progress, the items not
/// done yet are its progress, not a failed check: that check says `in
/// progress`, and the verdict is over the checks that can be judged (a real
/// violation among them is still FAILED).
fn verification(v: &VerifyReport, in_progress: bool) -> Markup {
    let pending = |c: &Check| in_progress && c.name == crate::verify::NO_WORK_LEFT;
    let ok = v.checks.iter().all(|c| c.ok || pending(c));
    let verdict = match (ok, in_progress) {
        (true, true) => "in progress: every check that can be judged yet holds",
        (true, false) => "every check holds",
        (false, _) => "FAILED",
    };
    html! {
        h2 { "verification: " span class=(if ok { "ok" } else { "fail" }) { (verdict) } }
        table {
            tr { th { "check" } th { "result" } th { "offenders" } }
            @for c in &v.checks {
                tr {
                    td { (c.description) }
                    @if pending(c) {
                        td { "in progress" }
                        td { (c.violations) " item(s) still to do" }
                    } @else {
                        td class=(if c.ok { "ok" } else { "fail" }) { (if c.ok { "ok" } else { "FAIL" }) }
                        td { (c.offenders.join("; ")) }
                    }
                }
            }
        }
        p { "ledger total " (v.ledger_total) " · expected " (v.expected_total) }
    }
}

/// The worker registry. A worker's counters are written with its heartbeat
/// (every few seconds): a dead worker's are as of its last one, so its row
/// says so and shows beside them what the ledger committed meanwhile.
pub(super) fn workers(all: &[WorkerRow], committed: &[Option<Committed>], watch: &Watch) -> Markup {
    let body = html! {
        table {
            tr { th { "worker" } th { "host" } th { "pid" } th { "version" } th { "state" } th { "last heartbeat" }
                 th { "items held" } th { "settled" } th { "failed" } th { "fence rejections" }
                 th { "committed while it lived (ledger)" } }
            @for (w, committed) in all.iter().zip(committed) {
                tr {
                    td.mono { (&w.id.simple().to_string()[..8]) }
                    td { (w.host) } td { (w.pid) } td { (w.version) } td { (w.state) }
                    td { (format!("{:.1}", w.heartbeat_age_secs)) " s ago" }
                    td { (w.leases_held) }
                    @if w.state == "dead" {
                        td { (w.items_settled) br; small { "as of the last heartbeat, " (w.heartbeat_at.format("%H:%M:%S")) " UTC" } }
                        td { (w.items_failed) br; small { "as of the last heartbeat" } }
                    } @else {
                        td { (w.items_settled) } td { (w.items_failed) }
                    }
                    td { (w.fence_rejections) }
                    td {
                        @if let Some(c) = committed {
                            span data-committed=(c.items) { (c.items) } " items in the ledger of "
                            @for (i, (id, period)) in c.runs.iter().enumerate() {
                                @if i > 0 { ", " }
                                a href=(format!("/runs/{id}")) { "run " (id) } " (" (period) ")"
                            }
                            br; small { "all workers of those runs: the ledger does not name the worker" }
                        } @else { "-" }
                    }
                }
            }
        }
        p.note {
            "settled and failed are the worker's own counters, written with its heartbeat every "
            (settled_engine::raw::workers::WORKER_HEARTBEAT_SECS) " s. A worker is dead once its heartbeat is "
            (settled_engine::raw::workers::WORKER_DEAD_AFTER_SECS) " s old; what it committed after its last \
             heartbeat is in the ledger, counted beside it."
        }
    };
    page("workers", Some(watch), body)
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
    page(&format!("{status} items"), None, body)
}

/// The live lock view.
pub(super) fn locks(rows: &[LockRow], whole_queries: bool, watch: &Watch) -> Markup {
    let waiting = rows.iter().filter(|r| !r.granted).count();
    let body = html! {
        p {
            (rows.len()) " lock(s), " b #waiting data-waiting=(waiting) { (waiting) " waiting" } ". "
            "Row locks taken by SELECT ... FOR UPDATE are not listed one by one by PostgreSQL; a backend blocked on one \
             shows as waiting on a transaction id or tuple."
        }
        @if !whole_queries {
            p.note { "Query literals are shown as ?; an operator's or an admin's token sees them." }
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
    page("locks", Some(watch), body)
}
