//! The continuous queues' pages as maud templates: every interpolated value
//! is escaped by the template engine; nothing here touches the database.

use maud::{html, Markup};
use settled_engine::continuous::QueueStats;

use super::pages::page;
use crate::api::metrics::Pickup;
use crate::queues::jobs::{Job, JobLine, JobState};
use crate::queues::{DeadLetter, QueueView, DEAD_LETTERS_SHOWN};
use chrono::{DateTime, Utc};
use settled_engine::raw::workers::WorkerRow;

fn state(view: &QueueView) -> &'static str {
    if view.paused {
        "paused"
    } else {
        "serving"
    }
}

fn oldest_ready(s: &QueueStats) -> String {
    if s.ready == 0 {
        "-".to_string()
    } else {
        format!("{:.1} s", s.oldest_ready_secs)
    }
}

/// The counts of one queue as table cells, each marked with its state.
fn counts(s: &QueueStats) -> Markup {
    html! {
        td data-ready=(s.ready) { (s.ready) }
        td data-scheduled=(s.scheduled) { (s.scheduled) }
        td data-processing=(s.processing) { (s.processing) }
        td data-failed=(s.failed) { (s.failed) }
        td data-oldest-ready=(format!("{:.3}", s.oldest_ready_secs)) { (oldest_ready(s)) }
    }
}

fn count_headers() -> Markup {
    html! { th { "ready" } th { "scheduled" } th { "processing" } th { "failed (dead letters)" } th { "oldest ready" } }
}

/// Every registered queue with its counts and the oldest ready job's age.
pub(super) fn queues(views: &[QueueView], watch: &super::Watch) -> Markup {
    let body = html! {
        table {
            tr { th { "queue" } th { "table" } th { "state" } (count_headers()) }
            @for v in views {
                tr {
                    td { a href=(format!("/queues/{}", v.name)) { (v.name) } }
                    td.mono { (v.table) }
                    td { (state(v)) }
                    @match &v.stats {
                        Some(s) => { (counts(s)) }
                        None => { td.fail colspan="5" { "cannot read its table: " (v.error.as_deref().unwrap_or("")) } }
                    }
                }
            }
        }
        @if views.is_empty() { p { "No continuous queues are registered." } }
    };
    page("queues", Some(watch), body)
}

/// What a queue's page shows besides its view.
pub(super) struct Shown<'a> {
    /// Its dead letters (None: its table cannot be read).
    pub dead: Option<&'a [DeadLetter]>,
    /// The pickup latency this process measured.
    pub pickup: Option<&'a Pickup>,
    /// How many the replay form just replayed.
    pub replayed: Option<u64>,
    /// A page of jobs for each state.
    pub jobs: &'a [StateJobs],
    /// Jobs on a page.
    pub limit: i64,
}

/// A page of one state's jobs.
pub(super) struct StateJobs {
    /// The state.
    pub state: JobState,
    /// The cursor it starts after (None: the first page).
    pub after: Option<String>,
    /// Its jobs, in the state's order.
    pub lines: Vec<JobLine>,
}

/// One queue: its state and counts, pickup latency, the jobs of each state,
/// dead letters with replay forms, and the pause or resume form.
pub(super) fn queue(view: &QueueView, shown: &Shown<'_>) -> Markup {
    let name = &view.name;
    let body = html! {
        @if let Some(n) = shown.replayed { p.ok #replayed { (n) " dead letter(s) replayed." } }
        p { "table " span.mono { (view.table) } " · " b #state { (state(view)) } }
        @let (verb, what) = if view.paused { ("resume", "resume: its workers claim again") } else { ("pause", "pause: its workers claim nothing") };
        form method="post" action=(format!("/dashboard/queues/{name}/{verb}")) { button { (what) } }
        @match &view.stats {
            Some(s) => { table { tr { (count_headers()) } tr { (counts(s)) } } }
            None => { p.fail { "cannot read its table: " (view.error.as_deref().unwrap_or("")) } }
        }
        h2 { "pickup latency" }
        (pickup_latency(shown.pickup))
        @for jobs in shown.jobs { (state_jobs(name, jobs, shown.limit)) }
        @if let Some(dead) = shown.dead { (dead_letters(name, dead, view.stats.as_ref().map_or(0, |s| s.failed))) }
        p.note { "Pause, resume and replay ask for the API token: any user name, the token as the password. \
                  Jobs are paged by keyset (each page starts after the last key of the one before; never OFFSET)." }
    };
    page(&format!("queue {name}"), None, body)
}

/// A key as one segment of a path: unreserved characters as they are,
/// every other byte percent-encoded (RFC 3986 section 2.3).
pub(super) fn path_segment(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn job_link(queue: &str, key: &str) -> String {
    format!("/queues/{}/jobs/{}", path_segment(queue), path_segment(key))
}

fn when(t: Option<DateTime<Utc>>) -> String {
    t.map_or(String::new(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

/// One state's page of jobs, with the link to its next page when full.
fn state_jobs(name: &str, jobs: &StateJobs, limit: i64) -> Markup {
    let state = jobs.state.as_str();
    let next = jobs
        .lines
        .last()
        .filter(|_| jobs.lines.len() as i64 == limit)
        .map(|last| {
            let mut query = form_urlencoded::Serializer::new(String::new());
            query
                .append_pair("state", state)
                .append_pair("after", &last.key)
                .append_pair("limit", &limit.to_string());
            format!("/queues/{}?{}#{state}", path_segment(name), query.finish())
        });
    html! {
        h2 id=(state) { (state) " jobs" @if jobs.after.is_some() { " (a later page)" } }
        @if jobs.lines.is_empty() {
            p { "None." }
        } @else {
            table data-state=(state) {
                tr { th { "key" } th { "attempts" } th { "priority" } th { "enqueued (UTC)" } th { "not before (UTC)" }
                     th { "lease until (UTC)" } th { "last error" } }
                @for j in &jobs.lines {
                    tr data-job=(j.key) {
                        td.mono { a href=(job_link(name, &j.key)) { (j.key) } }
                        td { (j.attempts) }
                        td { (j.priority) }
                        td { (when(Some(j.enqueued_at))) }
                        td { (when(Some(j.not_before))) }
                        td { (when(j.lease_until)) }
                        td { (j.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if let Some(next) = next { p { a rel="next" href=(next) { "more " (state) " jobs →" } } }
    }
}

/// One job: its state, attempts with their errors, its lease and holder.
pub(super) fn job(name: &str, job: &Job, holder: Option<&WorkerRow>) -> Markup {
    let line = &job.line;
    let attempts = job.errors.as_array().cloned().unwrap_or_default();
    let body = html! {
        p { "queue " a href=(format!("/queues/{}", path_segment(name))) { (name) } " · state " b #job-state { (job.status) } }
        table #job {
            tr { th { "key" } td.mono { (line.key) } }
            tr { th { "attempts counted" } td { (line.attempts) } }
            tr { th { "attempt (fence)" } td { (job.attempt) } }
            tr { th { "priority" } td { (line.priority) } }
            tr { th { "enqueued (UTC)" } td { (when(Some(line.enqueued_at))) } }
            tr { th { "not before (UTC)" } td { (when(Some(line.not_before))) } }
            tr { th { "last change (UTC)" } td { (when(Some(line.updated_at))) } }
            tr { th { "last error" } td { (line.last_error.as_deref().unwrap_or("")) } }
            tr { th { "lease holder" } td #lease-holder {
                @match (line.lease_owner, holder) {
                    (None, _) => "none",
                    (Some(owner), Some(w)) => { span.mono { (owner) } " · " (w.host) " pid " (w.pid) " · " (w.state)
                                                " · lease until " (when(line.lease_until)) }
                    (Some(owner), None) => { span.mono { (owner) } " (not in the worker registry) · lease until " (when(line.lease_until)) }
                }
            } }
        }
        h2 { "attempts" }
        @if attempts.is_empty() {
            p { "No failed attempt recorded." }
        } @else {
            table #attempts {
                tr { th { "attempt" } th { "at (UTC)" } th { "error" } }
                @for a in &attempts {
                    tr {
                        td { (a["attempt"]) }
                        td { (a["at"].as_str().unwrap_or("")) }
                        td { (a["error"].as_str().unwrap_or("")) }
                    }
                }
            }
        }
        h2 { "payload" }
        pre.mono { (serde_json::to_string_pretty(&job.payload).unwrap_or_default()) }
    };
    page(&format!("job {}", line.key), None, body)
}

fn pickup_latency(pickup: Option<&Pickup>) -> Markup {
    html! {
        @match pickup {
            Some(p) => p #pickup {
                "mean " (format!("{:.3}", p.mean_secs)) " s over " (p.jobs) " job(s) claimed by this server's process; 99% within "
                (p.p99_within_secs.map_or_else(|| "more than the largest bucket".to_string(), |s| format!("{s} s")))
            },
            None => p.note #pickup {
                "Not known here: this server's process has claimed no job of this queue. Each worker process \
                 measures it in its own work_queue_pickup_latency_seconds histogram."
            },
        }
    }
}

fn dead_letters(name: &str, dead: &[DeadLetter], failed: i64) -> Markup {
    html! {
        h2 { "dead letters" }
        @if dead.is_empty() {
            p { "No dead letters." }
        } @else {
            @if failed > dead.len() as i64 {
                p.note { "The newest " (DEAD_LETTERS_SHOWN) " of " (failed) "." }
            }
            table {
                tr { th { "key" } th { "attempts" } th { "failed (UTC)" } th { "last error" } th {} }
                @for d in dead {
                    tr {
                        td.mono { (d.key) }
                        td { (d.attempts) }
                        td { (d.failed_at.format("%Y-%m-%d %H:%M:%S")) }
                        td { (d.last_error.as_deref().unwrap_or("")) }
                        td {
                            form method="post" action=(format!("/dashboard/queues/{name}/replay")) {
                                input type="hidden" name="key" value=(d.key);
                                button { "replay" }
                            }
                        }
                    }
                }
            }
            form method="post" action=(format!("/dashboard/queues/{name}/replay")) {
                button { "replay every dead letter" }
            }
        }
    }
}
