//! A spent nonce with no receipt: the node counts a transaction's nonce as
//! mined (below its count of the hot wallet's mined transactions), yet none
//! of its attempts has a receipt (a node restarted from an older dump of
//! its state, or one whose index of receipts lags or was lost). No attempt
//! signed under that nonce can ever be mined again, so the transaction is
//! never replaced; after [`SPENT_GRACE`], this module finds the transaction
//! that spent the nonce in the canonical blocks themselves: from about when
//! the transaction took its nonce ([`SCAN_SLACK_SECS`] earlier) up to the
//! head, at most [`SCAN_BLOCKS_PER_ROUND`] blocks a round and
//! [`SCAN_BLOCKS_MAX`] in all, its progress kept between rounds.
//!
//! What it finds is the caller's (`confirm.rs`) to act on: one of the
//! transaction's attempts (mined: included at that block, as if its receipt
//! had been found), a transaction of the hot wallet not settled's (the key
//! used elsewhere: treated as a filler, its payouts signed again once it is
//! at depth), or nothing (the node lost that history: an operator is told,
//! nothing is guessed). For an attempt found so, still without a receipt
//! at depth, it reads the evidence of its outcome: the token's `Transfer`
//! logs of that transaction in that block (`transfers_in`), matched one to
//! one with its payouts (`unmatched`). It only reads the node.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use alloy_primitives::B256;

use super::store::ChainTx;
use super::{Chain, FOLLOW_EVERY};

/// How long a spent nonce may have no receipt for any attempt before its
/// blocks are searched. A node counts a nonce mined when it applies the
/// block, and answers the block's receipts from the same block: a receipt
/// trails the count by at most the node's own bookkeeping of that block,
/// well under one round. Ten rounds of the follower of heads
/// ([`FOLLOW_EVERY`], 5 s) leave room for a node catching up after a
/// restart, and cost nothing but the receipt calls a spent nonce makes each
/// round anyway; the search after it reads blocks, which is the expensive
/// part, and so waits.
pub(crate) const SPENT_GRACE: Duration = Duration::from_millis(10 * FOLLOW_EVERY.as_millis() as u64);

/// The search starts at the first block whose time is this many seconds
/// before the transaction took its nonce (the database's clock against the
/// node's; two minutes of skew between them, or of blocks timestamped
/// ahead, still finds it). A transaction that spent the nonce before
/// settled took it (the key used elsewhere while settled was stopped) is
/// older than the search: not found, and an operator is told.
pub(crate) const SCAN_SLACK_SECS: u64 = 120;

/// Blocks read per transaction per round: one `eth_getBlockByNumber` with
/// full transactions each (a batch block is a few hundred kilobytes at
/// most), so a round with a dozen spent nonces stays a few hundred calls.
pub(crate) const SCAN_BLOCKS_PER_ROUND: u64 = 64;

/// The most blocks searched for one nonce before an operator is told: about
/// seven hours of 12-second blocks, the time a transaction could plausibly
/// have waited in a pool (settled replaces a stuck one after a minute).
pub(crate) const SCAN_BLOCKS_MAX: u64 = 2_048;

/// A search in progress, kept between rounds by the process that follows
/// heads (a restart starts it again, after the grace).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Look {
    /// When its nonce was first seen spent with no receipt.
    first_seen: Instant,
    /// The next block to read (None: the start not found yet).
    next: Option<u64>,
    /// The first block read.
    from: u64,
}

/// The searches in progress, by transaction id.
pub(crate) type Looks = HashMap<i64, Look>;

/// What a search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// Not searched yet (in the grace), or not found in the blocks read so far.
    Looking,
    /// The transaction of the hot wallet under the nonce: in block `number`
    /// (hash `block`), its hash `hash` (one of the attempts, or not).
    Mined {
        /// The block's number.
        number: u64,
        /// The block's hash.
        block: B256,
        /// The transaction's hash.
        hash: B256,
    },
    /// Not in any block searched: the reason, for an operator.
    Lost(String),
}

/// One step of the search for the transaction that spent `tx`'s nonce,
/// `head` the newest block (read after the node's count of mined
/// transactions, so the nonce was spent at or before it).
pub(crate) async fn look(chain: &Chain, tx: &ChainTx, head: u64) -> anyhow::Result<Found> {
    let look = {
        let mut looks = chain.spent_looks.lock().expect("spent looks");
        *looks.entry(tx.id).or_insert(Look {
            first_seen: Instant::now(),
            next: None,
            from: 0,
        })
    };
    if look.first_seen.elapsed() < SPENT_GRACE {
        return Ok(Found::Looking);
    }
    let start = match look.next {
        Some(next) => next,
        None => {
            let since = (tx.created_unix.max(0) as u64).saturating_sub(SCAN_SLACK_SECS);
            let from = first_block_since(chain, since, head).await?;
            tracing::warn!(
                tx = tx.id,
                nonce = tx.nonce,
                from,
                head,
                "nonce spent and no attempt has a receipt: searching the blocks for the transaction that spent it"
            );
            from
        }
    };
    let from = if look.next.is_none() { start } else { look.from };
    let end = head.min(start.saturating_add(SCAN_BLOCKS_PER_ROUND - 1));
    let wallet = chain.wallet.address();
    let mut number = start;
    while number <= end {
        let Some(block) = chain.rpc.block_txs(number).await? else {
            break;
        };
        if let Some(found) = block
            .transactions
            .iter()
            .find(|t| t.from == wallet && t.nonce.to::<u64>() == tx.nonce as u64)
        {
            forget(chain, tx.id);
            return Ok(Found::Mined {
                number,
                block: block.hash,
                hash: found.hash,
            });
        }
        number += 1;
    }
    let read = number.saturating_sub(from);
    if number > head || read >= SCAN_BLOCKS_MAX {
        forget(chain, tx.id);
        let bound = if read >= SCAN_BLOCKS_MAX {
            format!(" (the search's bound of {SCAN_BLOCKS_MAX} blocks)")
        } else {
            String::new()
        };
        return Ok(Found::Lost(format!(
            "nonce {} counted mined by the node, no receipt for any of its {} attempts, and no transaction of \
             the hot wallet under it in blocks {from}..={}{bound}",
            tx.nonce,
            tx.attempts.len(),
            number.saturating_sub(1),
        )));
    }
    if let Some(kept) = chain.spent_looks.lock().expect("spent looks").get_mut(&tx.id) {
        kept.next = Some(number);
        kept.from = from;
    }
    Ok(Found::Looking)
}

/// Drops `tx_id`'s search.
pub(crate) fn forget(chain: &Chain, tx_id: i64) {
    chain.spent_looks.lock().expect("spent looks").remove(&tx_id);
}

/// Keeps only the searches of `ids` (transactions still in flight).
pub(crate) fn keep_only(chain: &Chain, ids: &[i64]) {
    chain
        .spent_looks
        .lock()
        .expect("spent looks")
        .retain(|id, _| ids.contains(id));
}

/// The first block at or before `head` whose time is at least `since`
/// (seconds since the Unix epoch): a binary search over the headers, block
/// times never going down along the chain. `head` itself when none is.
async fn first_block_since(chain: &Chain, since: u64, head: u64) -> anyhow::Result<u64> {
    let (mut low, mut high) = (0u64, head);
    while low < high {
        let mid = low + (high - low) / 2;
        let time = match chain.rpc.header(mid).await? {
            Some(header) => header.timestamp.to::<u64>(),
            None => u64::MAX,
        };
        if time >= since {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    Ok(low)
}

/// A token transfer from the hot wallet: (recipient, amount).
pub(super) type Transfer = (alloy_primitives::Address, alloy_primitives::U256);

/// `wanted` (a transaction's payouts) against `shown` (its transfers),
/// one to one: how many payouts no transfer shows, and how many transfers
/// no payout explains.
pub(super) fn unmatched(mut wanted: Vec<Transfer>, shown: &[Transfer]) -> (usize, usize) {
    let mut unexplained = 0;
    for transfer in shown {
        match wanted.iter().position(|w| w == transfer) {
            Some(i) => {
                wanted.swap_remove(i);
            }
            None => unexplained += 1,
        }
    }
    (wanted.len(), unexplained)
}

/// The token's transfers from the hot wallet made by transaction `hash` in
/// block `block`, by its `Transfer` logs.
pub(super) async fn transfers_in(chain: &Chain, block: B256, hash: B256) -> anyhow::Result<Vec<Transfer>> {
    use alloy_sol_types::SolEvent;
    let from = B256::left_padding_from(chain.wallet.address().as_slice());
    let logs = chain
        .rpc
        .logs_in_block(chain.token, super::abi::IERC20::Transfer::SIGNATURE_HASH, from, block)
        .await?;
    logs.into_iter()
        .filter(|log| log.transaction_hash == Some(hash) && log.block_hash.is_none_or(|b| b == block))
        .map(|log| super::reconcile::decode_transfer(&log))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Address, U256};

    fn t(byte: u8, amount: u64) -> Transfer {
        (Address::repeat_byte(byte), U256::from(amount))
    }

    #[test]
    fn a_transaction_without_receipt_succeeded_only_if_its_logs_show_each_payouts_transfer_once_and_nothing_else() {
        // A batch paying one creator twice the same amount: two transfers.
        let wanted = vec![t(1, 1000), t(2, 500), t(1, 1000)];
        assert_eq!(unmatched(wanted.clone(), &[t(1, 1000), t(1, 1000), t(2, 500)]), (0, 0));
        assert_eq!(unmatched(wanted.clone(), &[t(1, 1000), t(2, 500)]), (1, 0), "one short");
        assert_eq!(unmatched(wanted.clone(), &[]), (3, 0), "no logs: nothing shown");
        assert_eq!(
            unmatched(wanted.clone(), &[t(1, 1000), t(1, 1000), t(2, 500), t(3, 1)]),
            (0, 1),
            "a transfer no payout explains"
        );
        assert_eq!(
            unmatched(wanted, &[t(1, 1000), t(1, 999), t(2, 500)]),
            (1, 1),
            "another amount"
        );
    }
}
