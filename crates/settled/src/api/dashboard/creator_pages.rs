//! A creator's page as a maud template: its balances, holds and statement
//! (the same figures as `GET /v1/creators/{address}` and its statement).
//! Every interpolated value is escaped; nothing here touches the database.

use maud::{html, Markup};

use super::pages::page;
use crate::api::creators::{CreatorHold, LedgerEntry};
use crate::balance::{Balances, Statement};
use crate::money::tokens;
use crate::payouts::find;
use crate::verify::Check;

/// What a creator's page shows.
pub(super) struct CreatorView<'a> {
    /// The creator.
    pub creator: &'a str,
    /// Its balances.
    pub balances: &'a Balances,
    /// Its holds, newest first.
    pub holds: &'a [CreatorHold],
    /// Its ledger rows by period, newest first.
    pub ledger: &'a [LedgerEntry],
    /// Its newest payouts.
    pub payouts: &'a find::Page,
    /// The verifier's verdict on its balance, now.
    pub verdict: &'a Check,
    /// A page of its statement.
    pub statement: &'a Statement,
}

/// The page of one creator: balances, the verifier's verdict, holds (with
/// a release form on the active one), ledger rows by period, payouts, and a
/// page of its statement with a link to the next.
pub(super) fn creator(view: &CreatorView<'_>, decimals: u32) -> Markup {
    let CreatorView {
        creator,
        balances,
        holds,
        statement,
        ..
    } = *view;
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
        (verdict(view.verdict))
        h2 { "holds" }
        @if holds.is_empty() {
            p { "None." }
        } @else {
            table #holds {
                tr { th { "hold" } th { "reason" } th { "placed (UTC)" } th { "released (UTC)" } th {} }
                @for h in holds {
                    tr data-hold=(h.id) data-active=(h.active) {
                        td { (h.id) }
                        td { (h.reason) }
                        td { (h.created_at.format("%Y-%m-%d %H:%M:%S")) }
                        td { @match h.released_at { Some(at) => (at.format("%Y-%m-%d %H:%M:%S")), None => b { "active" } } }
                        td {
                            @if h.active {
                                form method="post" action=(format!("/dashboard/holds/{}/release", h.id)) {
                                    input type="hidden" name="from" value="creator";
                                    button { "release" }
                                }
                            }
                        }
                    }
                }
            }
        }
        (ledger(view.ledger, decimals))
        h2 { "payouts" }
        @if view.payouts.lines.is_empty() {
            p { "None." }
        } @else {
            table #payouts {
                tr { th { "payout" } th { "made (UTC)" } th { "amount" } th { "state" } }
                @for l in &view.payouts.lines {
                    tr { td { a href=(format!("/payouts/{}", l.id)) { (l.id) } }
                         td { (l.created_at.format("%Y-%m-%d %H:%M:%S")) } td.mono { (l.amount) } td { (l.status.as_str()) } }
                }
            }
            @if view.payouts.next.is_some() {
                p { a href=(format!("/payouts?creator={creator}")) { "all of its payouts" } }
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

/// The verifier's verdict on the creator's balance.
fn verdict(check: &Check) -> Markup {
    html! {
        h2 { "verification: "
            @if check.ok { span.ok data-verdict="ok" { "its balance equals its ledger less its payouts plus returns" } }
            @else { span.fail data-verdict="fail" { "FAILED" } }
        }
        @if !check.ok { p { (check.offenders.join("; ")) } }
        p.note { "Checked now by the rule of settled verify's " span.mono { (check.name) } "." }
    }
}

/// Its ledger rows by period, newest first.
fn ledger(rows: &[LedgerEntry], decimals: u32) -> Markup {
    html! {
        h2 { "ledger by period" }
        @if rows.is_empty() {
            p { "No ledger rows." }
        } @else {
            table #ledger {
                tr { th { "period" } th { "amount (base units)" } th { "tokens" } th { "run" } th { "at (UTC)" } }
                @for r in rows {
                    tr { td { (r.period) } td.mono { (r.amount) } td.mono { (tokens(&r.amount, decimals)) }
                         td { a href=(format!("/runs/{}", r.run_id)) { (r.run_id) } }
                         td { (r.created_at.format("%Y-%m-%d %H:%M:%S")) } }
                }
            }
        }
    }
}
