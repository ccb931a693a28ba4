//! A creator's page as a maud template: its balances, holds and statement
//! (the same figures as `GET /v1/creators/{address}` and its statement).
//! Every interpolated value is escaped; nothing here touches the database.

use maud::{html, Markup};

use super::pages::page;
use crate::api::creators::CreatorHold;
use crate::balance::{Balances, Statement};
use crate::money::tokens;

/// The page of one creator: balances, holds, and a page of its statement
/// with a link to the next.
pub(super) fn creator(
    creator: &str,
    balances: &Balances,
    holds: &[CreatorHold],
    statement: &Statement,
    decimals: u32,
) -> Markup {
    let body = html! {
        table #balances {
            tr { th { "balance" } th { "base units" } th { "tokens" } }
            tr data-posted=(balances.posted) { td { "posted" } td.mono { (balances.posted) } td.mono { (tokens(&balances.posted, decimals)) } }
            tr data-pending=(balances.pending) { td { "pending" } td.mono { (balances.pending) } td.mono { (tokens(&balances.pending, decimals)) } }
            tr data-available=(balances.available) { td { "available" } td.mono { (balances.available) } td.mono { (tokens(&balances.available, decimals)) } }
        }
        p.note {
            "Posted: every credit less the payouts paid. Pending: payouts in flight (created, queued, sent), \
             back on the balance if they fail or are returned. Available: what a new payout may take, posted less \
             pending, or 0 while a hold is active."
        }
        h2 { "holds" }
        @if holds.is_empty() {
            p { "None." }
        } @else {
            table #holds {
                tr { th { "hold" } th { "reason" } th { "placed (UTC)" } th { "released (UTC)" } }
                @for h in holds {
                    tr data-hold=(h.id) data-active=(h.active) {
                        td { (h.id) }
                        td { (h.reason) }
                        td { (h.created_at.format("%Y-%m-%d %H:%M:%S")) }
                        td { @match h.released_at { Some(at) => (at.format("%Y-%m-%d %H:%M:%S")), None => b { "active" } } }
                    }
                }
            }
        }
        h2 { "statement" }
        p { "opening balance " span.mono data-opening=(statement.opening_balance) { (statement.opening_balance) } }
        table #statement {
            tr { th { "at (UTC)" } th { "line" } th { "amount" } th { "balance" } th { "detail" } }
            @for l in &statement.lines {
                tr {
                    td { (l.at.map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string()).unwrap_or_else(|| "archived periods".into())) }
                    td { (l.kind.as_str()) }
                    td.mono data-amount=(l.amount) { (l.amount) }
                    td.mono data-balance=(l.balance) { (l.balance) }
                    td {
                        @if let Some(period) = l.period { "period " (period) }
                        @if let Some(id) = l.payout_id { "payout " (id) }
                        @if let Some(status) = &l.payout_status { " (" (status) ")" }
                        @if let Some(id) = l.hold_id { "hold " (id) }
                        @if let Some(note) = &l.note { " " (note) }
                    }
                }
            }
        }
        p { "closing balance " span.mono data-closing=(statement.closing_balance) { (statement.closing_balance) } }
        @if let Some(next) = &statement.next {
            p { a #next href=(format!("/creators/{creator}?after={next}")) { "next page" } }
        }
    };
    page(&format!("creator {creator}"), None, body)
}
