//! The settlement job on the engine: its work table, the handler that pays a
//! chunk (ledger rows and balance credits in one set-based statement), and
//! starting a period's run.
//!
//! The money path, top to bottom: `settled_engine::queue` claims a chunk with
//! SKIP LOCKED, [`SettleRewards::handle_chunk`] pays it on the same
//! transaction, the engine marks it settled and commits.

use std::sync::Arc;

use anyhow::Context;
use settled_engine::{runs, Chunk, ChunkHandler, HandlerError, QueueSpec, WorkQueue};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::money::FeeBps;
use crate::period::Period;

/// The job's name in `settled_engine.runs`.
pub const JOB: &str = "creator-rewards";
/// The fee applied when a period is seeded without one.
pub const DEFAULT_FEE_BPS: u32 = 250;

/// The settlement work table as an engine queue.
pub fn queue() -> Arc<WorkQueue> {
    Arc::new(
        WorkQueue::new(QueueSpec {
            job: JOB.into(),
            table: "settlement.token_trade_volume".into(),
            scope_column: "period".into(),
            scope_type: "date".into(),
            key_column: "creator".into(),
            key_type: "text".into(),
        })
        .expect("the settlement queue spec is valid"),
    )
}

/// Pays a chunk: one ledger row per creator at the period's fee, and the same
/// amount credited to the creator's balance, in one statement. The ledger's
/// primary key refuses a second payment; balances are credited in creator
/// order so two chunks touching the same creators never deadlock.
pub const PAY_CHUNK_SQL: &str = "
WITH credited AS (
    INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
    SELECT v.period, v.creator, div(v.volume * p.fee_bps, 10000), $3, v.attempt + 1
    FROM settlement.token_trade_volume v
    JOIN settlement.settlement_policy p ON p.period = v.period
    WHERE v.period = $1::date AND v.creator = ANY($2)
    ORDER BY v.creator
    RETURNING creator, amount
)
INSERT INTO settlement.creator_balance AS b (creator, balance)
SELECT creator, amount FROM credited ORDER BY creator
ON CONFLICT (creator) DO UPDATE
SET balance = b.balance + EXCLUDED.balance, updated_at = now()";

/// The settlement handler for in-transaction mode.
#[derive(Debug, Clone)]
pub struct SettleRewards {
    /// Simulated work per item, spent inside the transaction after the
    /// chunk's writes (benchmarks and crash tests; zero in production).
    pub work_per_item: std::time::Duration,
}

impl ChunkHandler for SettleRewards {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        let credited = sqlx::query(PAY_CHUNK_SQL)
            .bind(&chunk.scope)
            .bind(chunk.keys())
            .bind(chunk.run_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        // Simulated work after the writes and before the commit: the widest
        // window for a crash to leave something half written (it must not).
        if !self.work_per_item.is_zero() {
            tokio::time::sleep(self.work_per_item * chunk.items.len() as u32).await;
        }
        // Every claimed creator gets exactly one credit; anything else is a bug
        // (or a missing policy): refuse to commit.
        if credited != chunk.items.len() as u64 {
            return Err(HandlerError::Other(format!(
                "credited {credited} balances for {} claimed creators of period {}",
                chunk.items.len(),
                chunk.scope
            )));
        }
        Ok(())
    }
}

/// Sets a period's fee. Refused (by a trigger, in the database) once a run
/// for the period exists.
pub async fn set_policy(pool: &PgPool, period: Period, fee: FeeBps) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO settlement.settlement_policy (period, fee_bps) VALUES ($1, $2)
         ON CONFLICT (period) DO UPDATE SET fee_bps = EXCLUDED.fee_bps, updated_at = now()",
    )
    .bind(period.date())
    .bind(i32::from(fee.get()))
    .execute(pool)
    .await
    .map_err(
        |e| match e.as_database_error().map(|d| d.message().to_string()) {
            Some(msg) if msg.contains("frozen") => anyhow::anyhow!("{msg}"),
            _ => anyhow::Error::new(e).context(format!("setting the policy of {period}")),
        },
    )?;
    Ok(())
}

/// The period's fee, if a policy exists.
pub async fn policy(conn: &mut PgConnection, period: Period) -> anyhow::Result<Option<FeeBps>> {
    let bps: Option<i32> =
        sqlx::query_scalar("SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1")
            .bind(period.date())
            .fetch_optional(conn)
            .await?;
    bps.map(|b| FeeBps::new(b as u32).map_err(anyhow::Error::msg))
        .transpose()
}

/// Creates or joins the run for `period`. Refuses a period without a policy.
/// The policy row is held FOR SHARE while the run is inserted, so a
/// concurrent policy change either lands before the run or is refused.
pub async fn start_or_join_run(
    pool: &PgPool,
    period: Period,
    worker: Uuid,
) -> anyhow::Result<runs::Joined> {
    let mut tx = pool.begin().await?;
    let has_policy: Option<i32> = sqlx::query_scalar(
        "SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1 FOR SHARE",
    )
    .bind(period.date())
    .fetch_optional(&mut *tx)
    .await?;
    if has_policy.is_none() {
        // An existing run (say, from before a restore) may still be joined.
        if let Some(run) = runs::find(&mut tx, JOB, &period.to_string()).await? {
            tx.commit().await?;
            return Ok(runs::Joined {
                run,
                started: false,
            });
        }
        anyhow::bail!(
            "period {period} has no settlement policy: set one with `settled policy --period {period} --fee-bps B` before starting its run"
        );
    }
    let joined = runs::start_or_join(&mut tx, JOB, &period.to_string(), worker)
        .await
        .with_context(|| format!("starting the run for {period}"))?;
    tx.commit().await?;
    Ok(joined)
}
