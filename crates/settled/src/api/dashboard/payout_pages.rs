//! The payouts page as a maud template: every interpolated value is escaped
//! by the template engine; nothing here touches the database.

use maud::{html, Markup};

use super::pages::page;
use crate::money::tokens;
use crate::payouts::find;
use crate::payouts::overview::{Conflict, KeyAwaiting, Overview, StateTotals, UnknownEvent};
use crate::payouts::PayoutState;

/// What the payouts page lists beside the totals (the newest of each).
pub(super) struct Issues<'a> {
    pub(super) conflicts: &'a [Conflict],
    pub(super) unknown: &'a [UnknownEvent],
    pub(super) awaiting: &'a [KeyAwaiting],
}

fn age(secs: Option<f64>) -> String {
    match secs {
        None => "-".to_string(),
        Some(s) if s < 120.0 => format!("{s:.1} s"),
        Some(s) if s < 7_200.0 => format!("{:.1} min", s / 60.0),
        Some(s) if s < 172_800.0 => format!("{:.1} h", s / 3_600.0),
        Some(s) => format!("{:.1} days", s / 86_400.0),
    }
}

fn state_row(s: &StateTotals, decimals: u32) -> Markup {
    html! {
        tr id=(format!("state-{}", s.state)) {
            td { (s.state.as_str()) }
            td data-count=(s.count) { (s.count) }
            td.mono data-amount=(s.amount) { (s.amount) }
            td.mono { (tokens(&s.amount, decimals)) }
            td data-oldest=(s.oldest_secs.map(|s| format!("{s:.3}")).unwrap_or_default()) { (age(s.oldest_secs)) }
        }
    }
}

/// The provider keys waiting for an operator.
fn awaiting(overview: &Overview, keys: &[KeyAwaiting]) -> Markup {
    html! {
        h2 { "keys waiting for an operator (" (overview.keys_awaiting_operator) ")" }
        @if keys.is_empty() {
            p { "None." }
        } @else {
            p.note {
                "Past the provider's key window, the provider could not say whether it holds these payments: nothing \
                 is sent under them. Check with the provider; if it holds none, `SELECT settlement.renew_provider_key(key)` \
                 and replay the payout's delivery (docs/operations.md)."
            }
            table #keys-awaiting-operator {
                tr { th { "since (UTC)" } th { "key" } th { "payout" } th { "the provider said" } }
                @for k in keys {
                    tr data-key=(k.key) {
                        td { (k.since.format("%Y-%m-%d %H:%M:%S")) }
                        td.mono { (k.key) }
                        td { (k.payout_id.map(|id| id.to_string()).unwrap_or_default()) }
                        td { (k.detail) }
                    }
                }
            }
        }
    }
}

/// Payouts by state (count, amount, the oldest one's time in its state),
/// what came back, the newest conflicts and unknown provider events, and
/// the keys waiting for an operator.
pub(super) fn payouts(
    overview: &Overview,
    issues: &Issues<'_>,
    listed: &Listed<'_>,
    decimals: u32,
    watch: &super::Watch,
) -> Markup {
    let (conflicts, unknown) = (issues.conflicts, issues.unknown);
    let body = html! {
        form #find-creator method="get" action="/creators" {
            label { "creator " input type="text" name="address" placeholder="0x…" size="44"; }
            " " button type="submit" { "show balances and statement" }
        }
        table {
            tr { th { "state" } th { "payouts" } th { "amount (base units)" } th { "amount (tokens)" } th { "oldest in it" } }
            @for s in &overview.states { (state_row(s, decimals)) }
            tr { th { "all" } th data-total=(overview.total()) { (overview.total()) } th {} th {} th {} }
        }
        (list(listed, decimals))
        p #returned {
            (overview.returned_count) " payout(s) ended unpaid (failed, returned by the provider after it paid, \
             cancelled, expired) and returned "
            span.mono data-returned=(overview.returned_amount) { (overview.returned_amount) } " base units ("
            (tokens(&overview.returned_amount, decimals)) " tokens) to balances."
        }
        p.note {
            "A sent payout waits for the provider's word (its webhook, or a lookup once it is old); a queued one for \
             delivery. `settled reconcile --provider-url URL` compares every payout with the provider's records; \
             `settled verify --payouts` proves balances, histories and returns."
        }
        (awaiting(overview, issues.awaiting))
        h2 { "conflicts (" (overview.conflicts) ")" }
        @if conflicts.is_empty() {
            p { "No conflicts." }
        } @else {
            @if overview.conflicts > conflicts.len() as i64 { p.note { "The newest " (conflicts.len()) "." } }
            table #conflicts {
                tr { th { "at (UTC)" } th { "payout" } th { "its state" } th { "the provider said" } th { "source" } th { "event" } th { "detail" } }
                @for c in conflicts {
                    tr data-payout=(c.payout_id) {
                        td { (c.at.format("%Y-%m-%d %H:%M:%S")) }
                        td { (c.payout_id) }
                        td { (c.state) }
                        td { (c.provider_status) }
                        td { (c.source) }
                        td.mono { (c.event_id.as_deref().unwrap_or("")) }
                        td { (c.detail.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        h2 { "provider events for unknown payouts (" (overview.unknown_events) ")" }
        @if unknown.is_empty() {
            p { "None." }
        } @else {
            @if overview.unknown_events > unknown.len() as i64 { p.note { "The newest " (unknown.len()) "." } }
            table #unknown-events {
                tr { th { "received (UTC)" } th { "event" } th { "type" } th { "key" } th { "creator" } th { "amount" } }
                @for e in unknown {
                    tr {
                        td { (e.received_at.format("%Y-%m-%d %H:%M:%S")) }
                        td.mono { (e.id) }
                        td { (e.kind) }
                        td.mono { (e.provider_key.as_deref().unwrap_or("")) }
                        td.mono { (e.creator.as_deref().unwrap_or("")) }
                        td.mono { (e.amount.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    };
    page("payouts", Some(watch), body)
}

/// A page of the payouts list and the query that found it.
pub(super) struct Listed<'a> {
    /// The payouts, newest first.
    pub page: &'a find::Page,
    /// The filter's fields as given (status, creator, id, from, to, limit),
    /// kept in the form and in the next page's link.
    pub query: &'a [(&'static str, String)],
}

/// The filter form, the payouts of this page and the link to the next.
fn list(listed: &Listed<'_>, decimals: u32) -> Markup {
    let given = |name: &str| {
        listed
            .query
            .iter()
            .find(|(k, _)| *k == name)
            .map_or(String::new(), |(_, v)| v.clone())
    };
    let next = listed.page.next.map(|after| {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.extend_pairs(
            listed
                .query
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (*k, v.as_str())),
        );
        query.append_pair("after", &after.to_string());
        format!("/payouts?{}", query.finish())
    });
    html! {
        h2 { "payouts, newest first" }
        form #find-payouts method="get" action="/payouts" {
            label { "status " select name="status" {
                option value="" { "any" }
                @for state in PayoutState::ALL {
                    option value=(state.as_str()) selected[given("status") == state.as_str()] { (state.as_str()) }
                }
            } } " "
            label { "creator " input type="text" name="creator" size="44" placeholder="0x…" value=(given("creator")); } " "
            label { "id " input type="text" name="id" size="8" value=(given("id")); } " "
            label { "from " input type="text" name="from" size="12" placeholder="YYYY-MM-DD" value=(given("from")); } " "
            label { "to " input type="text" name="to" size="12" placeholder="YYYY-MM-DD" value=(given("to")); } " "
            button type="submit" { "find" }
        }
        @if listed.page.lines.is_empty() {
            p { "No payouts match." }
        } @else {
            table #payout-list {
                tr { th { "id" } th { "made (UTC)" } th { "kind" } th { "creator" } th { "amount (base units)" }
                     th { "tokens" } th { "state" } th { "since" } th { "provider id" } }
                @for l in &listed.page.lines {
                    tr data-listed=(l.id) {
                        td { a href=(format!("/payouts/{}", l.id)) { (l.id) } }
                        td { (l.created_at.format("%Y-%m-%d %H:%M:%S")) }
                        td { (l.kind) }
                        td.mono { a href=(format!("/creators/{}", l.creator)) { (l.creator) } }
                        td.mono { (l.amount) }
                        td.mono { (tokens(&l.amount, decimals)) }
                        td { (l.status.as_str()) }
                        td { (l.updated_at.format("%Y-%m-%d %H:%M:%S")) }
                        td.mono { (l.provider_id.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a rel="next" href=(next) { "older payouts →" } }
        }
        p.note { "Paged by keyset: each page starts after the last id of the one before (never OFFSET)." }
    }
}

/// One payout: what it is, its history with what moved it, the provider's
/// events about it, its return, its conflicts, its delivery job, and the
/// actions the API allows in its state; paid on a chain, its transactions.
pub(super) fn payout(d: &find::Detail, chain_txs: &[(i64, i64, String, bool)], decimals: u32) -> Markup {
    let l = &d.line;
    let body = html! {
        table {
            tr { th { "state" } td data-state=(l.status.as_str()) { (l.status.as_str()) } }
            tr { th { "kind" } td { (l.kind) } }
            tr { th { "creator" } td.mono { a href=(format!("/creators/{}", l.creator)) { (l.creator) } } }
            tr { th { "amount" } td.mono { (l.amount) " base units (" (tokens(&l.amount, decimals)) " tokens)" } }
            tr { th { "made (UTC)" } td { (l.created_at.format("%Y-%m-%d %H:%M:%S%.3f")) } }
            tr { th { "provider id" } td.mono { (l.provider_id.as_deref().unwrap_or("- (not accepted by the provider)")) } }
            tr { th { "provider key" } td.mono { (d.provider_key.as_deref().unwrap_or("")) } }
            tr { th { "last reason" } td { (l.reason.as_deref().unwrap_or("")) } }
        }
        h2 { "history" }
        table #history {
            tr { th { "at (UTC)" } th { "from" } th { "to" } th { "moved by" } th { "reason" } }
            @for m in &d.history {
                tr data-to=(m.to_state) {
                    td { (m.at.format("%Y-%m-%d %H:%M:%S%.3f")) }
                    td { (m.from_state.as_deref().unwrap_or("(made)")) }
                    td { (m.to_state) }
                    td data-moved-by=(m.moved_by.as_deref().unwrap_or("")) { (m.moved_by.as_deref().unwrap_or("-")) }
                    td { (m.reason.as_deref().unwrap_or("")) }
                }
            }
        }
        @if !chain_txs.is_empty() { (super::chain_pages::of_payout(chain_txs)) }
        h2 { "return of its funds" }
        @match &d.returned {
            Some((amount, at)) => p data-returned=(amount) {
                span.mono { (amount) } " base units back on the balance at " (at.format("%Y-%m-%d %H:%M:%S")) " UTC (once)."
            },
            None => p { "None: its funds are with the payout (" (l.status.as_str()) ")." },
        }
        h2 { "webhooks received for it (" (d.events.len()) ")" }
        @if !d.events.is_empty() {
            table #events {
                tr { th { "received (UTC)" } th { "event" } th { "type" } th { "outcome" } th { "detail" } }
                @for e in &d.events {
                    tr {
                        td { (e.received_at.format("%Y-%m-%d %H:%M:%S%.3f")) }
                        td.mono { (e.id) } td { (e.kind) } td { (e.outcome) }
                        td { (e.detail.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if !d.conflicts.is_empty() {
            h2 { "conflicts (" (d.conflicts.len()) ")" }
            table {
                tr { th { "at (UTC)" } th { "the provider said" } th { "source" } th { "detail" } }
                @for c in &d.conflicts {
                    tr { td { (c.at.format("%Y-%m-%d %H:%M:%S")) } td { (c.provider_status) } td { (c.source) }
                         td { (c.detail.as_deref().unwrap_or("")) } }
                }
            }
        }
        h2 { "delivery" }
        @match &d.delivery {
            Some(job) => {
                p { "job " (job.status) " · attempts " (job.attempt)
                    @if let Some(owner) = job.lease_owner { " · lease held by worker " span.mono { (owner.simple().to_string()[..8]) } } }
                @if let Some(e) = &job.last_error { p { "last error: " (e) } }
                @if job.errors.as_array().is_some_and(|a| !a.is_empty()) {
                    pre { (serde_json::to_string_pretty(&job.errors).unwrap_or_default()) }
                }
            },
            None => p { "No delivery job (a settlement's payout is paid by its run)." },
        }
        h2 { "actions" }
        @let actions = find::actions(l.status);
        @if actions.is_empty() {
            p { "no action: the API allows none in state " (l.status.as_str()) "; the provider's word moves it from here." }
        } @else {
            ul {
                @for (call, what) in actions {
                    li { span.mono { (call.replace("{id}", &l.id.to_string())) } ": " (what) }
                }
            }
            @if l.status == PayoutState::Created {
                form method="post" action=(format!("/dashboard/payouts/{}/cancel", l.id)) {
                    button { "cancel this payout" }
                }
            }
        }
    };
    page(&format!("payout {}", l.id), None, body)
}
