//! What a deliverer paying on a chain records of its hot wallet for
//! operators: the gas balance it reads from the node, and, less often, a
//! reconciliation with the token's `Transfer` logs (`chain::reconcile`,
//! the one home of that rule). One row per (chain, sender) in
//! `settlement.chain_wallet_watch`, overwritten; `settled serve` exports
//! it at scrape time (`settled_chain_gas_balance_wei`,
//! `settled_chain_reconcile_mismatches`). It moves no payout and signs
//! nothing; a failed round is logged and the next one tries again.
//!
//! A reconciliation reads the token's `Transfer` logs from block 0, which
//! grows with the wallet's history: the fleet runs one per period, by
//! whichever deliverer takes the turn first on the database's clock
//! ([`take_reconcile_turn`]), not one per deliverer and not one at each
//! deliverer's start (a deliverer's start is when a rollout brings many,
//! and when its first payouts wait for the node).

use std::time::Duration;

use sqlx::PgPool;

use super::store::lower;
use super::Chain;

/// Records the gas balance every `every`, and reconciles every
/// `reconcile_every` (never when `None`), until aborted.
pub(crate) async fn watch(
    pool: PgPool,
    chain: std::sync::Arc<Chain>,
    every: Duration,
    reconcile_every: Option<Duration>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(err) = record_gas(&pool, &chain).await {
            tracing::warn!(error = %format!("{err:#}"), "chain watch: gas balance not recorded");
        }
        let Some(period) = reconcile_every else { continue };
        // Half a tick early: a turn taken a hair less than a period ago is
        // due at this tick, not one tick later.
        let turn = take_reconcile_turn(
            &pool,
            chain.chain_id,
            chain.wallet.address(),
            period.saturating_sub(every / 2),
        );
        match turn.await {
            Ok(false) => {}
            Ok(true) => {
                if let Err(err) = record_reconcile(&pool, &chain).await {
                    tracing::warn!(error = %format!("{err:#}"), "chain watch: reconciliation not recorded");
                }
            }
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "chain watch: reconciliation turn not taken"),
        }
    }
}

/// Takes the fleet's turn to reconcile wallet `sender` on chain
/// `chain_id` with the chain: true when none was taken within `period` (on
/// the database's clock), and now the caller's. The wallet's row is the one
/// `record_gas` writes; without it there is no turn.
pub async fn take_reconcile_turn(
    pool: &PgPool,
    chain_id: u64,
    sender: alloy_primitives::Address,
    period: Duration,
) -> anyhow::Result<bool> {
    let taken = sqlx::query(
        "UPDATE settlement.chain_wallet_watch SET reconcile_turn_at = now()
         WHERE chain_id = $1 AND sender = $2
           AND (reconcile_turn_at IS NULL OR reconcile_turn_at <= now() - make_interval(secs => $3))",
    )
    .bind(chain_id as i64) // $1
    .bind(lower(sender)) // $2
    .bind(period.as_secs_f64()) // $3
    .execute(pool)
    .await?;
    Ok(taken.rows_affected() == 1)
}

/// Reads the hot wallet's gas balance from the node and records it.
pub(crate) async fn record_gas(pool: &PgPool, chain: &Chain) -> anyhow::Result<()> {
    let balance = chain.rpc.balance(chain.wallet.address()).await?;
    sqlx::query(
        "INSERT INTO settlement.chain_wallet_watch (chain_id, sender, gas_balance) VALUES ($1, $2, $3::numeric)
         ON CONFLICT (chain_id, sender) DO UPDATE SET gas_balance = excluded.gas_balance, observed_at = now()",
    )
    .bind(chain.chain_id as i64) // $1
    .bind(lower(chain.wallet.address())) // $2
    .bind(balance.to_string()) // $3
    .execute(pool)
    .await?;
    Ok(())
}

/// Reconciles the chain with the payouts (every sender of the chain, from
/// block 0) and records how many mismatches, and the first.
pub(crate) async fn record_reconcile(pool: &PgPool, chain: &Chain) -> anyhow::Result<()> {
    let mismatches = {
        let mut conn = pool.acquire().await?;
        super::reconcile::lasting_mismatches(&mut conn, &chain.rpc, chain.token, 0).await?
    };
    if let Some(first) = mismatches.first() {
        tracing::error!(mismatches = mismatches.len(), first = %first, "chain watch: the chain and settled disagree");
    }
    let moved = sqlx::query(
        "UPDATE settlement.chain_wallet_watch
         SET reconcile_mismatches = $3, reconcile_first = $4, reconciled_at = now()
         WHERE chain_id = $1 AND sender = $2",
    )
    .bind(chain.chain_id as i64) // $1
    .bind(lower(chain.wallet.address())) // $2
    .bind(i32::try_from(mismatches.len()).unwrap_or(i32::MAX)) // $3
    .bind(mismatches.first()) // $4
    .execute(pool)
    .await?;
    anyhow::ensure!(
        moved.rows_affected() == 1,
        "no wallet row to record the reconciliation in"
    );
    Ok(())
}
