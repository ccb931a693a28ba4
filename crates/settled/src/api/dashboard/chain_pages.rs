//! The chain rail's page (`/chain`) as a maud template: its transactions,
//! newest first, each with its nonce, state, every attempt's hash, its
//! block, and the payouts it pays. Nothing here touches the database.

use maud::{html, Markup};

use super::pages::page;
use crate::chain::listing::{Listed, Page};

fn block(l: &Listed) -> Markup {
    match (l.tx.block_number, &l.tx.block_hash) {
        (Some(n), Some(hash)) => html! {
            (n) br;
            span.mono title=(hash) data-block-hash=(hash) { (hash.get(..10).unwrap_or(hash)) "…" }
        },
        _ => html! { "-" },
    }
}

fn attempts(l: &Listed) -> Markup {
    html! {
        ol.attempts {
            @for a in &l.attempts {
                @let mined = l.tx.mined_hash.as_deref() == Some(a.hash.as_str());
                li data-hash=(a.hash) data-mined=[mined.then_some("true")] {
                    span.mono { (a.hash) }
                    " · fee cap " (a.max_fee_per_gas) " · tip " (a.max_priority_fee_per_gas) " wei/gas · "
                    (a.signed_at.format("%H:%M:%S%.3f"))
                    @if mined { " · " b { "mined" } }
                }
            }
        }
    }
}

fn payouts(l: &Listed) -> Markup {
    html! {
        @if l.payouts.is_empty() {
            (l.tx.purpose) " (no payout)"
        } @else {
            ul.payouts {
                @for p in &l.payouts {
                    li data-payout=(p.payout_id) {
                        a href=(format!("/payouts/{}", p.payout_id)) { "payout " (p.payout_id) }
                        " (" (p.status) ") " span.mono { (p.amount) } " to " span.mono { (p.recipient) }
                        @if p.given_up { " · given up (its batch reverted and was split)" }
                    }
                }
            }
        }
    }
}

/// `/chain`: the transactions of this page and the link to older ones.
pub(super) fn chain(listed: &Page, watch: &super::Watch) -> Markup {
    let body = html! {
        p.note {
            "Each transaction is one nonce of a hot wallet; a replacement is a later attempt under the same nonce, \
             and whichever attempt is mined counts. Included goes back to broadcast when a reorg takes its block \
             out. `settled wallet` shows balances and nonces; `settled reconcile --chain-rpc-url` compares the \
             chain's Transfer logs with the payouts."
        }
        @if listed.txs.is_empty() {
            p { "No transactions." }
        } @else {
            table #chain-txs {
                tr { th { "id" } th { "chain · sender" } th { "nonce" } th { "state" } th { "attempts (hashes)" }
                     th { "block" } th { "reorgs" } th { "pays" } th { "signed (UTC)" } }
                @for l in &listed.txs {
                    tr id=(format!("tx-{}", l.tx.id)) data-tx=(l.tx.id) data-state=(l.tx.state) {
                        td { (l.tx.id) }
                        td.mono { (l.tx.chain_id) " · " (l.tx.sender) }
                        td data-nonce=(l.tx.nonce) { (l.tx.nonce) }
                        td {
                            (l.tx.state)
                            @if let Some(why) = &l.tx.awaiting_operator_why {
                                br; b.awaiting-operator title=(why) { "waits for an operator" }
                            }
                        }
                        td { (attempts(l)) }
                        td { (block(l)) }
                        td data-reorgs=(l.tx.reorgs) { (l.tx.reorgs) }
                        td { (payouts(l)) }
                        td { (l.tx.created_at.format("%Y-%m-%d %H:%M:%S")) }
                    }
                }
            }
        }
        @if let Some(before) = listed.next {
            p { a rel="next" href=(format!("/chain?before={before}")) { "older transactions →" } }
        }
        p.note { "Paged by keyset: each page starts before the last id of the one before (never OFFSET)." }
    };
    page("chain transactions", Some(watch), body)
}

/// A payout's transactions, linked, for its page.
pub(super) fn of_payout(txs: &[(i64, i64, String, bool)]) -> Markup {
    html! {
        h2 { "on-chain" }
        @if txs.is_empty() {
            p { "No transaction (not paid on a chain, or not signed yet)." }
        } @else {
            ul #chain-txs-of-payout {
                @for (id, nonce, state, given_up) in txs {
                    li data-tx=(id) {
                        a href=(format!("/chain?tx={id}#tx-{id}")) { "transaction " (id) }
                        " · nonce " (nonce) " · " (state)
                        @if *given_up { " · given up" }
                    }
                }
            }
        }
    }
}
