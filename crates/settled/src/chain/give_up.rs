//! A nonce given up: a transaction that can never be valid as signed is
//! not left to block every later nonce. Its nonce is filled by a filler,
//! a zero-value transfer of the chain's coin from the hot wallet to
//! itself, signed as one more attempt of the same transaction (same
//! nonce, fees raised enough to replace) and stored before it is sent.
//! Whichever attempt is mined counts, as for any replacement: a mined
//! original pays its payouts; a filler at the confirmation depth makes the
//! transaction `filled`, and only then (`confirm.rs`) are its payouts
//! given up by it and signed again under new nonces. This module never
//! moves a payout.
//!
//! When is a transaction never valid: the node refuses its signed bytes
//! for a reason that is a property of those bytes against the chain's
//! rules, which no rebroadcast, fee or balance changes
//! (`broadcast::Sent::NeverValid`), or an operator says so
//! (`settled give-up --nonce N`).

use alloy_consensus::TxEip1559;
use alloy_primitives::{TxKind, U256};
use sqlx::PgPool;

use super::broadcast::{self, Sent};
use super::sign::{self, Fees};
use super::store::{self, ChainTx, TxState};
use super::Chain;

/// Gas of the filler: a plain transfer of the chain's coin, no call.
pub(crate) const FILLER_GAS_LIMIT: u64 = 21_000;

/// The fees of a filler for a transaction whose newest attempt offered
/// `old`: the replacement's raise (+12.5%, or the market), past the fee
/// cap if that is what replacing takes: the filler is 21,000 gas, and a
/// nonce that cannot be filled blocks every payout after it.
pub(crate) fn filler_fees(old: Fees, market: Fees) -> Fees {
    sign::replacement_fees(old, market, u128::MAX).expect("no cap leaves room for a raise")
}

/// Gives up transaction `tx` because of `why`: its filler signed, stored
/// as its newest attempt (the transaction marked given up), then sent.
/// False when it is given up already, or mined meanwhile.
pub(crate) async fn give_up(pool: &PgPool, chain: &Chain, tx: &ChainTx, why: &str) -> anyhow::Result<bool> {
    let latest = tx.latest();
    let fees = filler_fees(sign::fees_of(&latest.raw)?, chain.fees().await?);
    let signed = chain.wallet.sign(TxEip1559 {
        chain_id: chain.chain_id,
        nonce: tx.nonce as u64,
        gas_limit: FILLER_GAS_LIMIT,
        max_fee_per_gas: fees.max_fee_per_gas,
        max_priority_fee_per_gas: fees.max_priority_fee_per_gas,
        to: TxKind::Call(chain.wallet.address()),
        value: U256::ZERO,
        access_list: Default::default(),
        input: Default::default(),
    })?;
    let mut db = pool.begin().await?;
    if !store::mark_given_up(&mut db, tx.id, why).await? {
        return Ok(false);
    }
    let next = latest.attempt + 1;
    let filler = store::NewAttempt {
        signed: &signed,
        gas_limit: FILLER_GAS_LIMIT,
        fees,
        filler: true,
    };
    anyhow::ensure!(
        store::add_attempt(&mut db, tx.id, next, &filler).await?,
        "tx {}: its filler could not be stored",
        tx.id
    );
    db.commit().await?;
    tracing::warn!(tx = tx.id, nonce = tx.nonce, why, hash = %signed.hash,
                   "nonce given up: a filler signed under it; its payouts wait for the filler's confirmation");
    send_filler(pool, chain, tx, &signed.raw).await?;
    Ok(true)
}

/// Sends a filler and records its transaction as broadcast.
async fn send_filler(pool: &PgPool, chain: &Chain, tx: &ChainTx, raw: &[u8]) -> anyhow::Result<()> {
    match broadcast::send(&chain.rpc, raw).await {
        Ok(Sent::NeverValid(message)) => {
            tracing::error!(tx = tx.id, nonce = tx.nonce, message, "the node refuses the filler too");
        }
        Ok(_) => {}
        // Sent again by the follower of heads, like any stored attempt.
        Err(err) => tracing::warn!(tx = tx.id, error = %err, "sending the filler failed; it is sent again"),
    }
    let mut conn = pool.acquire().await?;
    store::mark_broadcast(&mut conn, tx.id).await?;
    Ok(())
}

/// The operator's give-up of the transaction under `nonce`: false when
/// there is none in flight (not mined yet) under it.
pub async fn give_up_nonce(pool: &PgPool, chain: &Chain, nonce: i64, why: &str) -> anyhow::Result<bool> {
    let txs = {
        let mut conn = pool.acquire().await?;
        store::in_flight(&mut conn, chain.chain_id, chain.wallet.address()).await?
    };
    let Some(tx) = txs
        .iter()
        .find(|t| t.nonce == nonce && matches!(t.state, TxState::Signed | TxState::Broadcast))
    else {
        return Ok(false);
    };
    give_up(pool, chain, tx, why).await
}
