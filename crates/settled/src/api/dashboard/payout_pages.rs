//! The payouts page as a maud template: every interpolated value is escaped
//! by the template engine; nothing here touches the database.

use maud::{html, Markup};

use super::pages::page;
use crate::money::tokens;
use crate::payouts::overview::{Conflict, KeyAwaiting, Overview, StateTotals, UnknownEvent};

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
pub(super) fn payouts(overview: &Overview, issues: &Issues<'_>, decimals: u32, watch: &super::Watch) -> Markup {
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
