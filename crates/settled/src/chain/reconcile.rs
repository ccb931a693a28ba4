//! `settled reconcile --chain-rpc-url`: the token's `Transfer` logs from
//! each hot wallet settled signs for, compared one to one with the payouts
//! its transactions pay. Every mismatch is named: a transfer no payout
//! explains (naming the payout it could be a second payment of, when one
//! pays the same creator the same amount), a transfer in a payout's
//! transaction to another recipient or of another amount, a paid payout
//! with no transfer, a confirmed transaction whose receipt is gone, a
//! transaction waiting for an operator (a spent nonce settled cannot
//! account for: each of its payouts named, sent and neither paid nor
//! failed until the operator acts). It
//! reads; it changes nothing. Callers take [`lasting_mismatches`], which
//! compares twice when the first finds anything.

use std::collections::BTreeMap;

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::SolEvent;
use sqlx::PgConnection;

use super::abi::IERC20;
use super::rpc::Rpc;
use super::store::{self, hex, lower};

/// One transfer read from the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Transfer {
    to: Address,
    value: U256,
    tx: B256,
}

/// A payout settled paid (or is paying) on-chain: its mined transaction.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Expected {
    payout_id: i64,
    status: String,
    recipient: String,
    amount: String,
    tx_state: String,
    mined_hash: Option<String>,
}

/// Compares the chain with the database; the mismatches, each a line
/// naming what differs.
pub(crate) async fn reconcile(
    conn: &mut PgConnection,
    rpc: &Rpc,
    token: Address,
    from_block: u64,
) -> anyhow::Result<Vec<String>> {
    let chain_id = rpc.chain_id().await?;
    let senders: Vec<String> = sqlx::query_scalar("SELECT sender FROM settlement.chain_senders WHERE chain_id = $1")
        .bind(chain_id as i64) // $1
        .fetch_all(&mut *conn)
        .await?;
    let head = rpc.block_number().await?;
    let mut mismatches = Vec::new();
    for sender in senders {
        let sender: Address = sender.parse()?;
        let transfers = transfers_from(rpc, token, sender, from_block, head).await?;
        let expected: Vec<Expected> = sqlx::query_as(
            "SELECT l.payout_id, p.status, l.recipient, l.amount::text AS amount, t.state AS tx_state, t.mined_hash
             FROM settlement.chain_tx_payouts l
             JOIN settlement.chain_txs t ON t.id = l.tx_id
             JOIN settlement.payouts p ON p.id = l.payout_id
             WHERE t.chain_id = $1 AND t.sender = $2 AND t.token = $3 AND NOT l.given_up
             ORDER BY l.payout_id",
        )
        .bind(chain_id as i64) // $1
        .bind(lower(sender)) // $2
        .bind(lower(token)) // $3
        .fetch_all(&mut *conn)
        .await?;
        mismatches.extend(compare(&expected, transfers, from_block));
        mismatches.extend(receipts_gone(rpc, &expected).await?);
        mismatches.extend(awaiting_operator(conn, chain_id, sender).await?);
    }
    Ok(mismatches)
}

/// How long after a comparison that found mismatches the second one runs:
/// long enough for the heads follower to record what moved.
pub(crate) const RECHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// The mismatches [`reconcile`] finds, kept only when a second comparison
/// [`RECHECK_AFTER`] later finds them too: the logs are read before the
/// database, so a transaction mined or reorged out between the two reads
/// looks like a mismatch once. A real one is found both times.
pub(crate) async fn lasting_mismatches(
    conn: &mut PgConnection,
    rpc: &Rpc,
    token: Address,
    from_block: u64,
) -> anyhow::Result<Vec<String>> {
    let first = reconcile(conn, rpc, token, from_block).await?;
    if first.is_empty() {
        return Ok(first);
    }
    tokio::time::sleep(RECHECK_AFTER).await;
    let second = reconcile(conn, rpc, token, from_block).await?;
    Ok(second.into_iter().filter(|m| first.contains(m)).collect())
}

async fn transfers_from(
    rpc: &Rpc,
    token: Address,
    sender: Address,
    from: u64,
    to: u64,
) -> anyhow::Result<Vec<Transfer>> {
    let topic1 = B256::left_padding_from(sender.as_slice());
    let logs = rpc
        .logs(token, IERC20::Transfer::SIGNATURE_HASH, Some(topic1), from, to)
        .await?;
    logs.into_iter()
        .map(|log| {
            let (to, value) = decode_transfer(&log)?;
            Ok(Transfer {
                to,
                value,
                tx: log.transaction_hash.unwrap_or_default(),
            })
        })
        .collect()
}

/// A token `Transfer` log's recipient and amount: the one decoding of the
/// chain's side, for this comparison and for a transaction's logs read in
/// place of its receipt (`spent::transfers_in`).
pub(super) fn decode_transfer(log: &super::rpc::Log) -> anyhow::Result<(Address, U256)> {
    let transfer = IERC20::Transfer::decode_raw_log(log.topics.iter().copied(), &log.data)?;
    Ok((transfer.to, transfer.value))
}

/// Matches each transfer with a payout of its transaction, one to one.
fn compare(expected: &[Expected], transfers: Vec<Transfer>, from_block: u64) -> Vec<String> {
    let mut open: BTreeMap<i64, &Expected> = expected
        .iter()
        .filter(|e| e.mined_hash.is_some())
        .map(|e| (e.payout_id, e))
        .collect();
    let mut out = Vec::new();
    for t in transfers {
        let in_tx: Vec<&Expected> = open
            .values()
            .copied()
            .filter(|e| e.mined_hash.as_deref() == Some(hex(t.tx).as_str()))
            .collect();
        let exact = in_tx
            .iter()
            .find(|e| e.recipient == lower(t.to) && e.amount == t.value.to_string());
        if let Some(e) = exact {
            open.remove(&e.payout_id);
            continue;
        }
        if let Some(e) = in_tx.first() {
            out.push(format!(
                "payout {}: its transaction {} transferred {} to {:#x}, the payout is {} to {}",
                e.payout_id,
                hex(t.tx),
                t.value,
                t.to,
                e.amount,
                e.recipient
            ));
            open.remove(&e.payout_id);
            continue;
        }
        let twin = expected
            .iter()
            .find(|e| e.recipient == lower(t.to) && e.amount == t.value.to_string());
        out.push(match twin {
            Some(e) => format!(
                "payout {}: paid twice? a transfer of {} to {:#x} in transaction {} is no payout's \
                 (the payout's transaction is {})",
                e.payout_id,
                t.value,
                t.to,
                hex(t.tx),
                e.mined_hash.as_deref().unwrap_or("not mined")
            ),
            None => format!(
                "transfer of {} to {:#x} in transaction {}: no payout explains it",
                t.value,
                t.to,
                hex(t.tx)
            ),
        });
    }
    for e in open.values() {
        if e.status == "paid" {
            out.push(format!(
                "payout {}: paid, but no transfer from the hot wallet in its transaction {} (from block {from_block})",
                e.payout_id,
                e.mined_hash.as_deref().unwrap_or("-")
            ));
        }
    }
    for e in expected.iter().filter(|e| e.status == "paid" && e.mined_hash.is_none()) {
        out.push(format!(
            "payout {}: paid, but its transaction was never mined",
            e.payout_id
        ));
    }
    out
}

/// The transactions of `sender` waiting for an operator, each payout named.
async fn awaiting_operator(conn: &mut PgConnection, chain_id: u64, sender: Address) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for t in store::awaiting_operator(conn, chain_id, sender).await? {
        if t.payout_ids.is_empty() {
            out.push(format!(
                "transaction under nonce {} ({}) waits for an operator: {}",
                t.nonce, t.state, t.why
            ));
        }
        for payout_id in &t.payout_ids {
            out.push(format!(
                "payout {payout_id}: sent, neither paid nor failed; its transaction under nonce {} ({}) waits for an operator: {}",
                t.nonce, t.state, t.why
            ));
        }
    }
    Ok(out)
}

/// Confirmed transactions whose receipt the node no longer has.
async fn receipts_gone(rpc: &Rpc, expected: &[Expected]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for e in expected.iter().filter(|e| e.tx_state == "confirmed") {
        let Some(hash) = &e.mined_hash else { continue };
        if !seen.insert(hash.clone()) {
            continue;
        }
        if rpc.receipt(hash.parse()?).await?.is_none() {
            out.push(format!(
                "payout {}: its confirmed transaction {hash} has no receipt on the node",
                e.payout_id
            ));
        }
    }
    Ok(out)
}
