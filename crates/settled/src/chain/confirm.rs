//! Following heads: every transaction of the hot wallet in flight is
//! looked at each round. Not mined: any of its attempts' receipts makes it
//! included (whichever attempt was mined counts); otherwise it is sent
//! again when never sent or sent long ago. A nonce the node counts mined
//! with no receipt for any attempt is never replaced (no attempt under it
//! can be mined any more): the transaction that spent it is searched for in
//! the blocks (`spent.rs`). Included: if its block is no
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
use super::spent::{self, transfers_in, unmatched, Found, Transfer};
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
    /// Whose nonce a transaction not settled's spent (found in a block).
    pub spent_elsewhere: usize,
    /// Marked for an operator: a spent nonce settled cannot account for.
    pub awaiting_operator: usize,
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
    // The count first: a nonce it says is spent was spent at or before `head`.
    let mined = chain.rpc.nonce(chain.wallet.address(), "latest").await?;
    let head = chain.rpc.block_number().await?;
    spent::keep_only(chain, &txs.iter().map(|t| t.id).collect::<Vec<_>>());
    let mut done = Round {
        in_flight: txs.len(),
        ..Round::default()
    };
    // The canonical block hash at each height asked about this round: the
    // transactions of one block ask once.
    let mut canonical = HashMap::new();
    for tx in txs {
        match tx.state {
            TxState::Signed | TxState::Broadcast => not_mined(pool, chain, &tx, mined, head, &mut done).await?,
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
/// mined transactions (the lowest nonce not mined), `head` the newest block.
async fn not_mined(
    pool: &PgPool,
    chain: &Chain,
    tx: &ChainTx,
    mined: u64,
    head: u64,
    done: &mut Round,
) -> anyhow::Result<()> {
    // A nonce at or past the node's count of mined transactions has no
    // mined attempt: its receipts are not asked for (a backlog of hundreds
    // in flight costs one call a round, not one per attempt).
    let spent = (tx.nonce as u64) < mined;
    let receipt = if spent { mined_receipt(chain, tx).await? } else { None };
    if let Some(receipt) = receipt {
        spent::forget(chain, tx.id);
        let number = receipt.block_number.to::<u64>();
        if include(pool, chain, tx, number, receipt.block_hash, receipt.transaction_hash).await? {
            done.included += 1;
        }
        return Ok(());
    }
    // Spent, and no attempt's receipt: no attempt signed under this nonce
    // can be mined any more, so it is neither replaced nor sent again (a
    // transaction never sent is sent once, which records it broadcast and
    // its payouts sent; the node answers that its nonce is spent). The
    // transaction that spent it is searched for instead.
    if spent && tx.state == TxState::Broadcast {
        return spent_nonce(pool, chain, tx, head, done).await;
    }
    if !spent
        && tx.state == TxState::Broadcast
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

/// Records `tx` (in its state as read) mined: attempt `hash` in block
/// `number` (hash `block`), its payouts pending. False when another process
/// moved it first.
async fn include(
    pool: &PgPool,
    chain: &Chain,
    tx: &ChainTx,
    number: u64,
    block: B256,
    hash: B256,
) -> anyhow::Result<bool> {
    let mut db = pool.begin().await?;
    if !store::mark_included(&mut db, tx.id, tx.state, number, block, hash).await? {
        return Ok(false);
    }
    move_payouts(&mut db, chain, tx.id, Word::Pending).await?;
    db.commit().await?;
    Ok(true)
}

/// `tx`'s nonce is spent and none of its attempts has a receipt: one step
/// of the search for the transaction that spent it ([`spent::look`]).
/// One of its attempts: included at that block, as if its receipt had been
/// found. A transaction not settled's: `tx` is given up (that transaction
/// stands for its filler) and included at that block under that hash, so
/// that at depth it is filled and its payouts signed again under new
/// nonces, as after a filler ([`at_depth`]). Not found: marked for an
/// operator, its payouts left sent.
async fn spent_nonce(pool: &PgPool, chain: &Chain, tx: &ChainTx, head: u64, done: &mut Round) -> anyhow::Result<()> {
    if tx.awaiting_operator {
        return Ok(());
    }
    match spent::look(chain, tx, head).await? {
        Found::Looking => {}
        Found::Mined { number, block, hash } if tx.has_attempt(hash) => {
            if include(pool, chain, tx, number, block, hash).await? {
                tracing::warn!(tx = tx.id, nonce = tx.nonce, block = number, hash = %hash,
                               "no receipt, but one of its attempts is in a canonical block: included");
                done.included += 1;
            }
        }
        Found::Mined { number, block, hash } => {
            let why = format!(
                "nonce {} spent by transaction {} (block {number}), not settled's: the hot wallet's key was used elsewhere",
                tx.nonce,
                store::hex(hash)
            );
            let mut db = pool.begin().await?;
            store::mark_given_up(&mut db, tx.id, &why).await?;
            if store::mark_included(&mut db, tx.id, tx.state, number, block, hash).await? {
                db.commit().await?;
                tracing::error!(tx = tx.id, nonce = tx.nonce, block = number, hash = %hash, why,
                                "nonce spent outside settled: its payouts are signed again once that transaction is at depth");
                done.spent_elsewhere += 1;
            }
        }
        Found::Lost(why) => {
            let what = "a spent nonce settled cannot account for: waiting for an operator; its payouts stay sent";
            await_operator(pool, tx, &why, what, done).await?;
        }
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
    // The canonical block at its height is the block it was found in (the
    // block's hash fixes its transactions): with no receipt for it at depth,
    // it is still there, and its outcome is read from other evidence.
    if at_height == Some(block) && deep_enough && receipt.is_none() {
        return without_receipt(pool, chain, tx, block, mined_hash, done).await;
    }
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
    let receipt = receipt.expect("checked above");
    at_depth(
        pool,
        chain,
        tx,
        block,
        receipt.transaction_hash,
        receipt.succeeded(),
        done,
    )
    .await
}

/// `tx`, mined as `mined_hash` in block `block` (canonical, at depth), and
/// the node has no receipt for it. A filler, or a transaction not
/// settled's: whatever its outcome, the nonce is spent by it, and `tx` is
/// filled. One of its own transfers: it succeeded only if the token's
/// `Transfer` logs of that transaction in that block show every payout's
/// transfer (recipient and amount, each once, nothing else); otherwise
/// nothing is assumed and it is marked for an operator, its payouts left
/// sent.
async fn without_receipt(
    pool: &PgPool,
    chain: &Chain,
    tx: &ChainTx,
    block: B256,
    mined_hash: B256,
    done: &mut Round,
) -> anyhow::Result<()> {
    if tx.filler_mined(mined_hash) || !tx.has_attempt(mined_hash) {
        return at_depth(pool, chain, tx, block, mined_hash, true, done).await;
    }
    if tx.awaiting_operator {
        return Ok(());
    }
    let paid = {
        let mut conn = pool.acquire().await?;
        store::payouts_of(&mut conn, tx.id).await?
    };
    let wanted: Vec<Transfer> = paid
        .iter()
        .filter(|p| !p.given_up)
        .map(|p| (p.recipient, p.amount.as_u256()))
        .collect();
    let transfers = transfers_in(chain, block, mined_hash).await?;
    let shown = transfers.len();
    let (missing, unexplained) = unmatched(wanted, &transfers);
    if missing == 0 && unexplained == 0 {
        tracing::warn!(tx = tx.id, nonce = tx.nonce, hash = %mined_hash,
                       "no receipt at depth; its Transfer logs show every payout's transfer: confirmed");
        return at_depth(pool, chain, tx, block, mined_hash, true, done).await;
    }
    let why = format!(
        "attempt {} mined in block {} and at depth, but the node has no receipt for it and the token's \
         Transfer logs of it show {shown} transfers ({} of its payouts' missing, {unexplained} unexplained): \
         its outcome is not known",
        store::hex(mined_hash),
        store::hex(block),
        missing
    );
    await_operator(pool, tx, &why, "waiting for an operator; its payouts stay sent", done).await
}

/// Marks `tx` as waiting for an operator, for `why`: logged as `what` and
/// counted in `done` the first time.
async fn await_operator(pool: &PgPool, tx: &ChainTx, why: &str, what: &str, done: &mut Round) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await?;
    if store::mark_awaiting_operator(&mut conn, tx.id, why).await? {
        tracing::error!(tx = tx.id, nonce = tx.nonce, why, "{what}");
        done.awaiting_operator += 1;
    }
    Ok(())
}

/// `tx`'s block `block` has the confirmation depth on it: the transaction
/// is final, `mined_hash` the transaction mined under its nonce. Its
/// transfer succeeded: confirmed, its payouts paid. It reverted: its
/// payouts failed (a batch: split, signed again in halves). Its filler was
/// mined, or a transaction not settled's (the hot wallet's key used
/// elsewhere, given up when found): filled, and only now, its nonce spent
/// by that transaction for good, are its payouts signed again under new
/// nonces.
async fn at_depth(
    pool: &PgPool,
    chain: &Chain,
    tx: &ChainTx,
    block: B256,
    mined_hash: B256,
    succeeded: bool,
    done: &mut Round,
) -> anyhow::Result<()> {
    let elsewhere = !tx.has_attempt(mined_hash);
    let to = if tx.filler_mined(mined_hash) || elsewhere {
        TxState::Filled
    } else if succeeded {
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
            let why = match elsewhere {
                true => "its nonce spent by a transaction not settled's, confirmed",
                false => "its filler confirmed",
            };
            if !paid.is_empty() {
                sign_again(&mut db, chain, tx, &paid, fees, why).await?;
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
    if matches!(word, Word::Pending) {
        // Pending moves a payout from `queued` to `sent` and nothing else:
        // those its delivery job or the broadcast moved already are left
        // unlocked (a payout no longer queued or sent is judged by the word
        // at depth, which records any conflict).
        let queued = store::still_queued(db, tx_id).await?;
        paid.retain(|p| queued.contains(&p.payout_id));
    }
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
