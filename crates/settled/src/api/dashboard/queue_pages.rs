//! The continuous queues' pages as maud templates: every interpolated value
//! is escaped by the template engine; nothing here touches the database.

use maud::{html, Markup};
use settled_engine::continuous::QueueStats;

use super::pages::page;
use crate::api::metrics::Pickup;
use crate::queues::{DeadLetter, QueueView, DEAD_LETTERS_SHOWN};

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

/// One queue: its state and counts, pickup latency, dead letters with
/// replay forms, and the pause or resume form.
pub(super) fn queue(
    view: &QueueView,
    dead: Option<&[DeadLetter]>,
    pickup: Option<&Pickup>,
    replayed: Option<u64>,
) -> Markup {
    let name = &view.name;
    let body = html! {
        @if let Some(n) = replayed { p.ok #replayed { (n) " dead letter(s) replayed." } }
        p { "table " span.mono { (view.table) } " · " b #state { (state(view)) } }
        @let (verb, what) = if view.paused { ("resume", "resume: its workers claim again") } else { ("pause", "pause: its workers claim nothing") };
        form method="post" action=(format!("/dashboard/queues/{name}/{verb}")) { button { (what) } }
        @match &view.stats {
            Some(s) => { table { tr { (count_headers()) } tr { (counts(s)) } } }
            None => { p.fail { "cannot read its table: " (view.error.as_deref().unwrap_or("")) } }
        }
        h2 { "pickup latency" }
        (pickup_latency(pickup))
        @if let Some(dead) = dead { (dead_letters(name, dead, view.stats.as_ref().map_or(0, |s| s.failed))) }
        p.note { "Pause, resume and replay ask for the API token: any user name, the token as the password." }
    };
    page(&format!("queue {name}"), None, body)
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
