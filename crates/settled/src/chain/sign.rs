//! Write-ahead signing: the one place a chain transaction comes to be. In
//! one database transaction the sender's nonce row is locked, the next
//! nonce taken, the transaction signed, and its bytes, hash and nonce
//! stored with the payouts it pays; only after that commit may anyone
//! broadcast it. A payout already paid by a transaction (its row in
//! `settlement.chain_tx_payouts`), or no longer queued, is never signed for
//! again: the statement refuses, the database transaction rolls back, and
//! the nonce is not spent.

use alloy_consensus::TxEip1559;
use alloy_primitives::{Address, TxKind, U256};
use alloy_sol_types::SolCall;
use sqlx::{PgConnection, PgPool};

use super::abi::{PayMany, IERC20};
use super::store::lower;
use super::Chain;
use crate::payouts::PayoutRow;

/// Gas for one `transfer` (a token's transfer costs about 35,000-52,000;
/// the rest is headroom for tokens with hooks). A limit too low reverts:
/// the payout fails and its funds return, nothing is lost.
pub(crate) const TRANSFER_GAS_LIMIT: u64 = 100_000;
/// The most gas a batch is given: this, plus [`BATCH_GAS_PER_TRANSFER`]
/// per payout; its limit while the token's cost is not measured
/// ([`BatchGas`]).
pub(crate) const BATCH_GAS_BASE: u64 = 60_000;
/// Gas per payout of a batch, at the most.
pub(crate) const BATCH_GAS_PER_TRANSFER: u64 = 60_000;
/// A batch's gas limit over its measured cost, in quarters (+25%).
pub(crate) const BATCH_GAS_HEADROOM_QUARTERS: u64 = 5;

/// What a batch of the chain's token costs through the batch contract,
/// measured once per process from the node's estimates ([`measure`]).
///
/// A block takes a transaction only while its gas limit fits in what the
/// block has left, so a limit far over the gas used leaves blocks part
/// empty (the most, 60,000 a payout against about 26,000 used, fits ten
/// batches of 100 in 30,000,000 gas, 86%); a limit under it reverts the
/// batch, which is split and paid in halves (nothing is lost, gas is).
/// The cost is measured to fresh addresses, the dearest recipients of a
/// plain token (a zero balance written), with 25% on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchGas {
    /// The call's own cost.
    pub base: u64,
    /// Each transfer's.
    pub per_transfer: u64,
}

impl BatchGas {
    /// The gas limit of a batch of `n` payouts: the measured cost with
    /// [`BATCH_GAS_HEADROOM_QUARTERS`], never over the most.
    pub(crate) fn limit(self, n: u64) -> u64 {
        let cost = self.base.saturating_add(self.per_transfer.saturating_mul(n));
        cost.saturating_mul(BATCH_GAS_HEADROOM_QUARTERS)
            .div_ceil(4)
            .min(most_batch_gas(n))
    }
}

/// The most gas a batch of `n` is given.
pub(crate) fn most_batch_gas(n: u64) -> u64 {
    BATCH_GAS_BASE + BATCH_GAS_PER_TRANSFER * n
}

/// Measures a batch's cost: the node's estimates of the batch contract
/// paying one unit of the token to one fresh address, and to two.
/// Err when the node cannot estimate them (the contract's approval not
/// mined yet, a wallet without two units).
pub(crate) async fn measure(chain: &Chain, batch: super::Batch) -> anyhow::Result<BatchGas> {
    let fresh = || {
        let digest = alloy_primitives::keccak256(uuid::Uuid::new_v4().as_bytes());
        Address::from_slice(&digest[12..])
    };
    let mut estimates = Vec::with_capacity(2);
    for n in [1usize, 2] {
        let call = PayMany::payCall {
            token: chain.token,
            recipients: (0..n).map(|_| fresh()).collect(),
            amounts: vec![U256::from(1u8); n],
        };
        let gas = chain
            .rpc
            .estimate_gas(chain.wallet.address(), batch.contract, call.abi_encode().into())
            .await?;
        estimates.push(gas);
    }
    let per_transfer = estimates[1].saturating_sub(estimates[0]);
    anyhow::ensure!(per_transfer > 0, "estimates {estimates:?} say a transfer costs nothing");
    Ok(BatchGas {
        base: estimates[0].saturating_sub(per_transfer),
        per_transfer,
    })
}

/// The fees an attempt is signed with, in wei per gas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fees {
    /// The most paid per gas, base fee and tip together.
    pub max_fee_per_gas: u128,
    /// The tip.
    pub max_priority_fee_per_gas: u128,
}

/// What a transaction calls: the token's `transfer` for one payout, the
/// batch contract's `pay` for several.
pub(crate) fn call_for(chain: &Chain, payouts: &[PayoutRow]) -> anyhow::Result<(Address, Vec<u8>, u64)> {
    let recipients = payouts
        .iter()
        .map(|p| p.creator.as_str().parse::<Address>())
        .collect::<Result<Vec<_>, _>>()?;
    let amounts: Vec<U256> = payouts.iter().map(|p| p.amount.as_u256()).collect();
    match (payouts, chain.batch) {
        ([_], _) => Ok((
            chain.token,
            IERC20::transferCall {
                to: recipients[0],
                value: amounts[0],
            }
            .abi_encode(),
            TRANSFER_GAS_LIMIT,
        )),
        (many, Some(batch)) if !many.is_empty() && many.len() <= batch.max as usize => Ok((
            batch.contract,
            PayMany::payCall {
                token: chain.token,
                recipients,
                amounts,
            }
            .abi_encode(),
            most_batch_gas(many.len() as u64),
        )),
        _ => anyhow::bail!("{} payouts cannot go in one transaction here", payouts.len()),
    }
}

/// Signs one transaction paying `payout` (and, with a batch contract, up
/// to its batch size of other queued payouts that have no transaction)
/// under the sender's next nonce and stores it, all in one database
/// transaction. Returns its id, or None when the payout has a transaction
/// already or is no longer queued (nothing was stored, no nonce spent).
pub async fn sign_ahead(pool: &PgPool, chain: &Chain, payout: &PayoutRow, fees: Fees) -> anyhow::Result<Option<i64>> {
    let mut db = pool.begin().await?;
    let nonce = lock_nonce(&mut db, chain).await?;
    // Many deliverers wait on the nonce row at once, most of them for
    // payouts the holder before them just put in its batch: those leave
    // now, before any signing, rather than sign and roll back.
    if !still_unsigned(&mut db, payout.id).await? {
        db.rollback().await?;
        return Ok(None);
    }
    let mut payouts = vec![payout.clone()];
    if let Some(batch) = chain.batch {
        payouts.extend(gather(&mut db, Some(payout.id), batch.max as i64 - 1).await?);
    }
    let Some(tx_id) = sign_in(&mut db, chain, nonce, &payouts, fees, &["queued"]).await? else {
        db.rollback().await?;
        return Ok(None);
    };
    db.commit().await?;
    Ok(Some(tx_id))
}

/// The most transactions of the sender signed or sent and not yet mined
/// for a deliverer to sign another batch ahead of its jobs
/// ([`sign_next`]). Enough for about three blocks of batches on a chain
/// with a 30,000,000 gas limit; nodes keep a bounded number of a sender's
/// pending transactions, and every one signed ahead waits behind the
/// lowest that is stuck.
pub(crate) const AHEAD_MAX_UNMINED: i64 = 32;

/// With a batch contract: signs one batch of the oldest queued payouts
/// that have no transaction (creators not on hold), under the sender's
/// next nonce, ahead of their delivery jobs, unless
/// [`AHEAD_MAX_UNMINED`] of the sender's transactions are signed or sent
/// and not mined. Its id, or None when nothing was signed. The payouts'
/// jobs find the transaction, as a batch's other payouts do.
pub(crate) async fn sign_next(pool: &PgPool, chain: &Chain, fees: Fees) -> anyhow::Result<Option<i64>> {
    let Some(batch) = chain.batch else { return Ok(None) };
    let mut db = pool.begin().await?;
    // The payouts first (row locks, skipping those another signer holds),
    // the nonce row only when there is something to sign: most calls come
    // once the backlog is signed and find nothing, and must not queue on
    // the row every signer needs.
    let payouts = gather(&mut db, None, batch.max as i64).await?;
    if payouts.is_empty() {
        db.rollback().await?;
        return Ok(None);
    }
    let unmined: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement.chain_txs
         WHERE chain_id = $1 AND sender = $2 AND state IN ('signed', 'broadcast')",
    )
    .bind(chain.chain_id as i64) // $1
    .bind(lower(chain.wallet.address())) // $2
    .fetch_one(&mut *db)
    .await?;
    if unmined >= AHEAD_MAX_UNMINED {
        db.rollback().await?;
        return Ok(None);
    }
    let nonce = lock_nonce(&mut db, chain).await?;
    let Some(tx_id) = sign_in(&mut db, chain, nonce, &payouts, fees, &["queued"]).await? else {
        db.rollback().await?;
        return Ok(None);
    };
    db.commit().await?;
    Ok(Some(tx_id))
}

/// Locks the sender's nonce row (until the database transaction ends) and
/// reads its next nonce.
pub(crate) async fn lock_nonce(db: &mut PgConnection, chain: &Chain) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT next_nonce FROM settlement.chain_senders WHERE chain_id = $1 AND sender = $2 FOR UPDATE",
    )
    .bind(chain.chain_id as i64) // $1
    .bind(lower(chain.wallet.address())) // $2
    .fetch_one(&mut *db)
    .await?)
}

/// True when payout `id` is queued and no transaction pays it.
async fn still_unsigned(db: &mut PgConnection, id: i64) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT p.status = 'queued'
                AND NOT EXISTS (SELECT 1 FROM settlement.chain_tx_payouts l WHERE l.payout_id = p.id AND NOT l.given_up)
         FROM settlement.payouts p WHERE p.id = $1",
    )
    .bind(id) // $1
    .fetch_optional(&mut *db)
    .await?
    .unwrap_or(false))
}

/// Up to `max` queued payouts besides `first` with no transaction, whose
/// creators are not on hold, oldest first: the rest of a batch.
async fn gather(db: &mut PgConnection, first: Option<i64>, max: i64) -> anyhow::Result<Vec<PayoutRow>> {
    if max <= 0 {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as(&format!(
        "SELECT {} FROM settlement.payouts p
         WHERE p.status = 'queued' AND p.id IS DISTINCT FROM $1
           AND NOT EXISTS (SELECT 1 FROM settlement.chain_tx_payouts l WHERE l.payout_id = p.id AND NOT l.given_up)
           AND NOT EXISTS (SELECT 1 FROM settlement.creator_holds h
                           WHERE h.creator = p.creator AND h.released_at IS NULL)
         ORDER BY p.id LIMIT $2
         FOR NO KEY UPDATE SKIP LOCKED",
        crate::payouts::PAYOUT_COLUMNS
    ))
    .bind(first) // $1
    .bind(max) // $2
    .fetch_all(&mut *db)
    .await?)
}

/// Signs one transaction paying `payouts` under `nonce` (the sender's row
/// locked by the caller's database transaction) and stores it, its first
/// attempt and its payouts, advancing the nonce. None when one of the
/// payouts has a transaction already, or is in none of `statuses`: the
/// caller rolls back.
pub async fn sign_in(
    db: &mut PgConnection,
    chain: &Chain,
    nonce: i64,
    payouts: &[PayoutRow],
    fees: Fees,
    statuses: &[&str],
) -> anyhow::Result<Option<i64>> {
    let (target, input, mut gas_limit) = call_for(chain, payouts)?;
    if payouts.len() > 1 {
        gas_limit = chain.batch_gas_limit(payouts.len() as u64).await;
    }
    let Some(tx_id) = store_signed(db, chain, nonce, target, input, gas_limit, fees, "payouts").await? else {
        return Ok(None);
    };
    let ids: Vec<i64> = payouts.iter().map(|p| p.id).collect();
    let linked = sqlx::query(
        "INSERT INTO settlement.chain_tx_payouts (payout_id, tx_id, position, recipient, amount)
         SELECT p.id, $2, (x.position - 1)::int, p.creator, p.amount
         FROM unnest($1::bigint[]) WITH ORDINALITY AS x(id, position)
         JOIN settlement.payouts p ON p.id = x.id AND p.status = ANY($3)
         ON CONFLICT (payout_id) WHERE NOT given_up DO NOTHING",
    )
    .bind(&ids) // $1
    .bind(tx_id) // $2
    .bind(statuses) // $3
    .execute(&mut *db)
    .await?;
    if linked.rows_affected() != ids.len() as u64 {
        return Ok(None);
    }
    tracing::info!(tx = tx_id, nonce, payouts = ?ids, "signed and stored before broadcast");
    Ok(Some(tx_id))
}

/// Signs a call of `target` with `input` under `nonce`, stores the
/// transaction (for `purpose`) and its first attempt, and advances the
/// sender's nonce; its id.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn store_signed(
    db: &mut PgConnection,
    chain: &Chain,
    nonce: i64,
    target: Address,
    input: Vec<u8>,
    gas_limit: u64,
    fees: Fees,
    purpose: &str,
) -> anyhow::Result<Option<i64>> {
    let sender = lower(chain.wallet.address());
    let signed = chain.wallet.sign(TxEip1559 {
        chain_id: chain.chain_id,
        nonce: nonce as u64,
        gas_limit,
        max_fee_per_gas: fees.max_fee_per_gas,
        max_priority_fee_per_gas: fees.max_priority_fee_per_gas,
        to: TxKind::Call(target),
        value: U256::ZERO,
        access_list: Default::default(),
        input: input.into(),
    })?;
    let tx_id: i64 = sqlx::query_scalar(
        "INSERT INTO settlement.chain_txs (chain_id, sender, nonce, target, token, purpose)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(chain.chain_id as i64) // $1
    .bind(&sender) // $2
    .bind(nonce) // $3
    .bind(lower(target)) // $4
    .bind(lower(chain.token)) // $5
    .bind(purpose) // $6
    .fetch_one(&mut *db)
    .await?;
    // Its state is `signed`: the first attempt goes in directly.
    sqlx::query(
        "INSERT INTO settlement.chain_tx_attempts
             (tx_id, attempt, hash, raw, gas_limit, max_fee_per_gas, max_priority_fee_per_gas)
         VALUES ($1, 1, $2, $3, $4, $5::numeric, $6::numeric)",
    )
    .bind(tx_id) // $1
    .bind(super::store::hex(signed.hash)) // $2
    .bind(&signed.raw) // $3
    .bind(gas_limit as i64) // $4
    .bind(fees.max_fee_per_gas.to_string()) // $5
    .bind(fees.max_priority_fee_per_gas.to_string()) // $6
    .execute(&mut *db)
    .await?;
    sqlx::query("UPDATE settlement.chain_senders SET next_nonce = next_nonce + 1 WHERE chain_id = $1 AND sender = $2")
        .bind(chain.chain_id as i64) // $1
        .bind(&sender) // $2
        .execute(&mut *db)
        .await?;
    Ok(Some(tx_id))
}

/// Gas for the approval of the batch contract.
pub(crate) const APPROVE_GAS_LIMIT: u64 = 100_000;

/// With a batch contract: makes sure the hot wallet lets it spend the
/// token, signing an approval ahead (unless one is in flight) when the
/// allowance is under half the largest. The approval's nonce is below every
/// batch signed after it, so it is mined first.
pub(crate) async fn ensure_approval(pool: &PgPool, chain: &Chain) -> anyhow::Result<()> {
    let Some(batch) = chain.batch else { return Ok(()) };
    let call = IERC20::allowanceCall {
        owner: chain.wallet.address(),
        spender: batch.contract,
    };
    let answer = chain.rpc.eth_call(chain.token, call.abi_encode().into()).await?;
    let allowance = IERC20::allowanceCall::abi_decode_returns(&answer)?;
    if allowance >= U256::MAX >> 1 {
        return Ok(());
    }
    let fees = chain.fees().await?;
    let mut db = pool.begin().await?;
    let nonce = lock_nonce(&mut db, chain).await?;
    let in_flight: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement.chain_txs
         WHERE chain_id = $1 AND sender = $2 AND purpose = 'approve' AND state IN ('signed', 'broadcast', 'included')",
    )
    .bind(chain.chain_id as i64) // $1
    .bind(lower(chain.wallet.address())) // $2
    .fetch_one(&mut *db)
    .await?;
    if in_flight == 0 {
        let input = IERC20::approveCall {
            spender: batch.contract,
            value: U256::MAX,
        }
        .abi_encode();
        store_signed(
            &mut db,
            chain,
            nonce,
            chain.token,
            input,
            APPROVE_GAS_LIMIT,
            fees,
            "approve",
        )
        .await?;
        tracing::info!(nonce, spender = %batch.contract, "approval of the batch contract signed ahead");
    }
    db.commit().await?;
    Ok(())
}

/// The least raise of both fees a replacement offers over the attempt it
/// replaces, in eighths (+12.5%: nodes refuse a replacement under +10%).
pub(crate) const REPLACEMENT_RAISE_EIGHTHS: u128 = 9;

/// The fees of a replacement for an attempt signed with `old`: at least
/// +12.5% on both, at least what `market` offers now, never above `cap`.
/// None when the cap leaves no room for a raise of at least 10% (the
/// attempt waits for the base fee to fall).
pub(crate) fn replacement_fees(old: Fees, market: Fees, cap: u128) -> Option<Fees> {
    let raise = |v: u128| (v.saturating_mul(REPLACEMENT_RAISE_EIGHTHS)).div_ceil(8).max(v + 1);
    let max_fee = raise(old.max_fee_per_gas).max(market.max_fee_per_gas).min(cap);
    let tip = raise(old.max_priority_fee_per_gas)
        .max(market.max_priority_fee_per_gas)
        .min(max_fee);
    let enough = |new: u128, old: u128| new.saturating_mul(10) >= old.saturating_mul(11);
    (enough(max_fee, old.max_fee_per_gas) && enough(tip, old.max_priority_fee_per_gas)).then_some(Fees {
        max_fee_per_gas: max_fee,
        max_priority_fee_per_gas: tip,
    })
}

/// Signs a replacement of the transaction whose newest attempt is `raw`:
/// the same transaction (nonce, call, gas limit), fees `fees`.
pub(crate) fn replacement(chain: &Chain, raw: &[u8], fees: Fees) -> anyhow::Result<(super::wallet::Signed, u64)> {
    use alloy_eips::eip2718::Decodable2718;
    let envelope = alloy_consensus::TxEnvelope::decode_2718(&mut &raw[..])?;
    let Some(signed) = envelope.as_eip1559() else {
        anyhow::bail!("a stored attempt is not an EIP-1559 transaction");
    };
    let mut tx = signed.tx().clone();
    tx.max_fee_per_gas = fees.max_fee_per_gas;
    tx.max_priority_fee_per_gas = fees.max_priority_fee_per_gas;
    let gas_limit = tx.gas_limit;
    Ok((chain.wallet.sign(tx)?, gas_limit))
}

/// The fees an attempt stored as `raw` was signed with.
pub(crate) fn fees_of(raw: &[u8]) -> anyhow::Result<Fees> {
    use alloy_eips::eip2718::Decodable2718;
    let envelope = alloy_consensus::TxEnvelope::decode_2718(&mut &raw[..])?;
    let Some(signed) = envelope.as_eip1559() else {
        anyhow::bail!("a stored attempt is not an EIP-1559 transaction");
    };
    Ok(Fees {
        max_fee_per_gas: signed.tx().max_fee_per_gas,
        max_priority_fee_per_gas: signed.tx().max_priority_fee_per_gas,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GWEI: u128 = 1_000_000_000;

    fn fees(max: u128, tip: u128) -> Fees {
        Fees {
            max_fee_per_gas: max * GWEI,
            max_priority_fee_per_gas: tip * GWEI,
        }
    }

    #[test]
    fn a_batchs_gas_limit_is_its_measured_cost_and_a_quarter_never_over_the_most() {
        let gas = BatchGas {
            base: 30_000,
            per_transfer: 26_000,
        };
        assert_eq!(gas.limit(100), (30_000 + 26_000 * 100) * 5 / 4);
        assert!(gas.limit(100) < most_batch_gas(100));
        let dear = BatchGas {
            base: 30_000,
            per_transfer: 70_000,
        };
        assert_eq!(dear.limit(100), most_batch_gas(100), "never over the most");
        // Ten batches of 100 at the most fill a 30 M block; at the measured
        // limit, eleven fit.
        let used = 2_585_000;
        let fit = |limit: u64| (0..).take_while(|k| k * used + limit <= 30_000_000).count();
        assert_eq!(fit(most_batch_gas(100)), 10);
        assert_eq!(fit(gas.limit(100)), 11);
    }

    #[test]
    fn a_replacement_raises_both_fees_by_at_least_an_eighth_or_to_the_market_never_past_the_cap() {
        let raised = replacement_fees(fees(8, 1), fees(3, 1), 500 * GWEI).unwrap();
        assert_eq!(
            raised,
            Fees {
                max_fee_per_gas: 9 * GWEI,
                max_priority_fee_per_gas: GWEI * 9 / 8
            }
        );
        let market = replacement_fees(fees(3, 1), fees(21, 1), 500 * GWEI).unwrap();
        assert_eq!(market.max_fee_per_gas, 21 * GWEI, "the market, when it is higher");
        let capped = replacement_fees(fees(8, 1), fees(40, 1), 20 * GWEI).unwrap();
        assert_eq!(capped.max_fee_per_gas, 20 * GWEI, "never past the cap");
        assert_eq!(
            replacement_fees(fees(20, 1), fees(40, 1), 21 * GWEI),
            None,
            "+5% is no replacement"
        );
    }
}
