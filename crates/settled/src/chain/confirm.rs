//! Following heads: every transaction of the hot wallet in flight is
//! looked at each round. Not mined: any of its attempts' receipts makes it
//! included (whichever attempt was mined counts); otherwise it is sent
//! again when never sent or sent long ago. Included: if its block is no
//! longer the canonical block at that height, a reorg took it out, and it
//! goes back to broadcast and is sent again; once its block has the
//! confirmation depth on it, it is confirmed (its payouts paid) or
//! reverted (its payouts failed, funds returned once), through the payout
//! state machine's own function. Each move is a conditional update in the
//! database transaction that moves the payouts, so any number of processes
//! can follow the same wallet.

use std::collections::HashMap;
use std::time::Duration;

use alloy_primitives::B256;
use sqlx::PgPool;

use super::broadcast::{self, Sent};
use super::rail::reverted_reason;
use super::rpc::Receipt;
use super::store::{self, ChainTx, TxState};
use super::{give_up, sign, Chain, REBROADCAST_AFTER};
use crate::payouts::{apply_words, ProviderWord, Source};

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// Transactions in flight looked at.
    pub in_flight: usize,
    /// Sent (again).
    pub broadcast: usize,
    /// Found mined.
    pub included: usize,
    /// Replaced (stuck).
    pub replaced: usize,
    /// Whose block left the canonical chain.
    pub reorged: usize,
    /// Confirmed at depth.
    pub confirmed: usize,
    /// Reverted at depth.
    pub reverted: usize,
    /// Batches that reverted and were split.
    pub split: usize,
    /// Given up, their fillers confirmed (their payouts signed again).
    pub filled: usize,
    /// Given up because the node refused their bytes as never valid.
    pub given_up: usize,
}

/// Follows heads every `every` until aborted.
pub(crate) async fn follow(pool: PgPool, chain: std::sync::Arc<Chain>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(err) = round(&pool, &chain).await {
            tracing::warn!(error = %format!("{err:#}"), "following the chain's heads failed; trying again");
        }
    }
}

/// One look at every transaction in flight.
pub async fn round(pool: &PgPool, chain: &Chain) -> anyhow::Result<Round> {
    let txs = {
        let mut conn = pool.acquire().await?;
        store::in_flight(&mut conn, chain.chain_id, chain.wallet.address()).await?
    };
    let head = chain.rpc.block_number().await?;
    let mined = chain.rpc.nonce(chain.wallet.address(), "latest").await?;
    let mut done = Round {
        in_flight: txs.len(),
        ..Round::default()
    };
    // The canonical block hash at each height asked about this round: the
    // transactions of one block ask once.
    let mut canonical = HashMap::new();
    for tx in txs {
        match tx.state {
            TxState::Signed | TxState::Broadcast => not_mined(pool, chain, &tx, mined, &mut done).await?,
            TxState::Included => included(pool, chain, &tx, head, &mut canonical, &mut done).await?,
            TxState::Confirmed | TxState::Reverted | TxState::Filled => {}
        }
    }
    Ok(done)
}

/// The receipt of whichever of `tx`'s attempts was mined.
async fn mined_receipt(chain: &Chain, tx: &ChainTx) -> anyhow::Result<Option<Receipt>> {
    for attempt in &tx.attempts {
        if let Some(receipt) = chain.rpc.receipt(attempt.hash).await? {
            return Ok(Some(receipt));
        }
    }
    Ok(None)
}

/// `tx`, not found mined; `mined` is the node's count of the wallet's
/// mined transactions (the lowest nonce not mined).
async fn not_mined(pool: &PgPool, chain: &Chain, tx: &ChainTx, mined: u64, done: &mut Round) -> anyhow::Result<()> {
    // A nonce at or past the node's count of mined transactions has no
    // mined attempt: its receipts are not asked for (a backlog of hundreds
    // in flight costs one call a round, not one per attempt).
    let receipt = if (tx.nonce as u64) < mined {
        mined_receipt(chain, tx).await?
    } else {
        None
    };
    if let Some(receipt) = receipt {
        let mut db = pool.begin().await?;
        let number = receipt.block_number.to::<u64>();
        if store::mark_included(
            &mut db,
            tx.id,
            tx.state,
            number,
            receipt.block_hash,
            receipt.transaction_hash,
        )
        .await?
        {
            move_payouts(&mut db, chain, tx.id, Word::Pending).await?;
            db.commit().await?;
            done.included += 1;
        }
        return Ok(());
    }
    if tx.state == TxState::Broadcast
        && tx.since_signed_ms >= chain.replace_after.as_millis() as i64
        && replace(pool, chain, tx, mined).await?
    {
        done.replaced += 1;
        return Ok(());
    }
    let due = tx
        .since_broadcast_ms
        .is_none_or(|ms| ms >= REBROADCAST_AFTER.as_millis() as i64);
    if tx.state == TxState::Signed || due {
        done.broadcast += 1;
        rebroadcast(pool, chain, tx, done).await?;
    }
    Ok(())
}

/// Replaces `tx`, stuck: its newest attempt again with higher fees, the
/// same nonce, stored as a new attempt (every attempt's hash is kept; the
/// one mined counts) before it is broadcast. False when the fee cap
/// leaves no room, or another process replaced it first; and when it waits
/// behind a lower nonce not mined yet (`mined` is the lowest) while
/// offering the market's fees: it waits for that nonce, not for fees, and a
/// raise would only spend more.
async fn replace(pool: &PgPool, chain: &Chain, tx: &ChainTx, mined: u64) -> anyhow::Result<bool> {
    let latest = tx.latest();
    let old = sign::fees_of(&latest.raw)?;
    let market = chain.fees().await?;
    if tx.nonce as u64 > mined && old.max_fee_per_gas >= market.max_fee_per_gas {
        return Ok(false);
    }
    let Some(fees) = sign::replacement_fees(old, market, chain.fee_cap) else {
        tracing::warn!(tx = tx.id, nonce = tx.nonce, "stuck at the fee cap: not replaced");
        return Ok(false);
    };
    let (signed, gas_limit) = sign::replacement(chain, &latest.raw, fees)?;
    let mut db = pool.begin().await?;
    let new = store::NewAttempt {
        signed: &signed,
        gas_limit,
        fees,
        filler: latest.filler,
    };
    if !store::add_attempt(&mut db, tx.id, latest.attempt + 1, &new).await? {
        return Ok(false);
    }
    db.commit().await?;
    tracing::info!(tx = tx.id, nonce = tx.nonce, attempt = latest.attempt + 1, hash = %signed.hash,
                   max_fee = fees.max_fee_per_gas, "stuck: replaced with higher fees");
    match broadcast::send(&chain.rpc, &signed.raw).await? {
        Sent::NonceUsed => tracing::info!(
            tx = tx.id,
            nonce = tx.nonce,
            "nonce spent: an earlier attempt was mined"
        ),
        // Given up by the next round, when the newest attempt is sent again.
        Sent::NeverValid(why) => tracing::warn!(tx = tx.id, why, "the node refuses the replacement as never valid"),
        Sent::Accepted | Sent::AlreadyKnown => {}
    }
    let mut conn = pool.acquire().await?;
    store::mark_broadcast(&mut conn, tx.id).await?;
    Ok(true)
}

/// Sends `tx`'s newest attempt again and records it as broadcast, its
/// payouts sent.
async fn rebroadcast(pool: &PgPool, chain: &Chain, tx: &ChainTx, done: &mut Round) -> anyhow::Result<()> {
    match broadcast::send(&chain.rpc, &tx.latest().raw).await? {
        Sent::NonceUsed => tracing::info!(
            tx = tx.id,
            nonce = tx.nonce,
            "nonce spent; looking for the mined attempt"
        ),
        Sent::NeverValid(why) => {
            if give_up::give_up(pool, chain, tx, &why).await? {
                done.given_up += 1;
            }
            return Ok(());
        }
        Sent::Accepted | Sent::AlreadyKnown => {}
    }
    let mut db = pool.begin().await?;
    if store::mark_broadcast(&mut db, tx.id).await? {
        move_payouts(&mut db, chain, tx.id, Word::Pending).await?;
    }
    db.commit().await?;
    Ok(())
}

/// `tx`, included in a block: still there (the canonical block at its
/// height is that block, which holds it), or taken out by a reorg; at
/// depth, final. Its receipt is read only at depth, and must be in that
/// block too.
async fn included(
    pool: &PgPool,
    chain: &Chain,
    tx: &ChainTx,
    head: u64,
    canonical: &mut HashMap<u64, Option<B256>>,
    done: &mut Round,
) -> anyhow::Result<()> {
    let (number, block, mined_hash) = tx.mined.expect("an included transaction has its block");
    let at_height = match canonical.get(&number) {
        Some(hash) => *hash,
        None => {
            let hash = chain.rpc.header(number).await?.map(|h| h.hash);
            canonical.insert(number, hash);
            hash
        }
    };
    let deep_enough = head + 1 >= number + chain.confirmations;
    let receipt = match at_height == Some(block) && deep_enough {
        true => chain.rpc.receipt(mined_hash).await?,
        false => None,
    };
    let still_there =
        at_height == Some(block) && (!deep_enough || receipt.as_ref().is_some_and(|r| r.block_hash == block));
    if !still_there {
        let mut db = pool.begin().await?;
        if store::mark_reorged(&mut db, tx.id, block).await? {
            db.commit().await?;
            tracing::warn!(tx = tx.id, nonce = tx.nonce, block = number, %block, "its block left the canonical chain: broadcast again");
            done.reorged += 1;
            let _ = broadcast::send(&chain.rpc, &tx.latest().raw).await;
        }
        return Ok(());
    }
    if !deep_enough {
        return Ok(());
    }
    at_depth(pool, chain, tx, block, receipt.expect("checked above"), done).await
}

/// `tx`'s block `block` has the confirmation depth on it: the transaction
/// is final. Its transfer succeeded: confirmed, its payouts paid. It
/// reverted: its payouts failed (a batch: split, signed again in halves).
/// Its filler was mined: filled, and only now, its nonce spent by the
/// filler for good, are its payouts signed again under new nonces.
async fn at_depth(
    pool: &PgPool,
    chain: &Chain,
    tx: &ChainTx,
    block: B256,
    receipt: Receipt,
    done: &mut Round,
) -> anyhow::Result<()> {
    let to = if tx.filler_mined(receipt.transaction_hash) {
        TxState::Filled
    } else if receipt.succeeded() {
        TxState::Confirmed
    } else {
        TxState::Reverted
    };
    // Fees for payouts signed again, read before the database transaction.
    let fees = match to {
        TxState::Confirmed => None,
        _ => Some(chain.fees().await?),
    };
    let mut db = pool.begin().await?;
    if !store::mark_final(&mut db, tx.id, block, to).await? {
        return Ok(());
    }
    let paid = store::payouts_of(&mut db, tx.id).await?;
    match (to, fees) {
        (TxState::Filled, Some(fees)) => {
            if !paid.is_empty() {
                sign_again(&mut db, chain, tx, &paid, fees, "its filler confirmed").await?;
            }
            done.filled += 1;
        }
        (TxState::Reverted, Some(fees)) if paid.len() > 1 => {
            sign_again(&mut db, chain, tx, &paid, fees, "a batch reverted").await?;
            done.split += 1;
            done.reverted += 1;
        }
        (TxState::Reverted, _) => {
            move_payouts(&mut db, chain, tx.id, Word::Failed(reverted_reason(tx))).await?;
            done.reverted += 1;
        }
        _ => {
            move_payouts(&mut db, chain, tx.id, Word::Paid).await?;
            done.confirmed += 1;
        }
    }
    db.commit().await?;
    Ok(())
}

/// Signs `paid`, the payouts of `tx`, again (`why`): `tx` is final, a
/// batch that reverted or a nonce filled, so its nonce is spent and none of
/// its attempts can be mined again. Its payouts are given up by it and
/// signed again in two halves (one payout: alone) under new nonces, in the
/// database transaction that records `tx` final. A half of one payout is a
/// plain transfer: if it reverts, that payout alone fails.
async fn sign_again(
    db: &mut sqlx::PgConnection,
    chain: &Chain,
    tx: &ChainTx,
    paid: &[store::Paid],
    fees: sign::Fees,
    why: &str,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        store::give_up_payouts(db, tx.id).await?,
        "tx {} ({why}) has no payout to give up",
        tx.id
    );
    let mut payouts = Vec::with_capacity(paid.len());
    for p in paid {
        let row = crate::payouts::row::load(db, p.payout_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("payout {} is gone", p.payout_id))?;
        payouts.push(row);
    }
    for half in payouts.chunks(payouts.len().div_ceil(2)) {
        let nonce = sign::lock_nonce(db, chain).await?;
        let signed = sign::sign_in(db, chain, nonce, half, fees, &["queued", "sent"]).await?;
        anyhow::ensure!(signed.is_some(), "batch {}: a half could not be signed again", tx.id);
    }
    tracing::warn!(
        tx = tx.id,
        nonce = tx.nonce,
        payouts = paid.len(),
        why,
        "payouts signed again under new nonces"
    );
    Ok(())
}

/// What a transaction's move says of its payouts.
enum Word {
    Pending,
    Paid,
    Failed(String),
}

/// Moves the payouts of transaction `tx_id` by `word`, through the payout
/// state machine (`settlement.apply_provider_word`) in one statement, by
/// payout id: a repeat moves nothing.
async fn move_payouts(db: &mut sqlx::PgConnection, chain: &Chain, tx_id: i64, word: Word) -> anyhow::Result<()> {
    let mut paid = store::payouts_of(db, tx_id).await?;
    paid.sort_by_key(|p| p.payout_id);
    let words: Vec<(i64, ProviderWord)> = paid
        .iter()
        .map(|paid| {
            let provider_id = chain.payment_id(paid.payout_id);
            let word = match &word {
                Word::Pending => ProviderWord::Pending { provider_id },
                Word::Paid => ProviderWord::Paid { provider_id },
                Word::Failed(reason) => ProviderWord::Failed {
                    provider_id: Some(provider_id),
                    reason: reason.clone(),
                },
            };
            (paid.payout_id, word)
        })
        .collect();
    apply_words(db, &words, Source::Poll, None).await?;
    Ok(())
}
