//! What a deliverer paying on a chain records of its hot wallet for
//! operators: the gas balance it reads from the node, and, less often, a
//! reconciliation with the token's `Transfer` logs ([`super::reconcile`],
//! the one home of that rule). One row per (chain, sender) in
//! `settlement.chain_wallet_watch`, overwritten; `settled serve` exports
//! it at scrape time (`settled_chain_gas_balance_wei`,
//! `settled_chain_reconcile_mismatches`). It moves no payout and signs
//! nothing; a failed round is logged and the next one tries again.

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
    let mut reconciled: Option<tokio::time::Instant> = None;
    loop {
        tick.tick().await;
        if let Err(err) = record_gas(&pool, &chain).await {
            tracing::warn!(error = %format!("{err:#}"), "chain watch: gas balance not recorded");
        }
        let due = reconcile_every.is_some_and(|period| reconciled.is_none_or(|at| at.elapsed() >= period));
        if !due {
            continue;
        }
        reconciled = Some(tokio::time::Instant::now());
        if let Err(err) = record_reconcile(&pool, &chain).await {
            tracing::warn!(error = %format!("{err:#}"), "chain watch: reconciliation not recorded");
        }
    }
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
