//! The settlement job on the engine: its work table, the handler that pays a
//! chunk (ledger rows and balance credits in one set-based statement), and
//! starting a period's run.
//!
//! The money path, top to bottom: `settled_engine::queue` claims a chunk with
//! SKIP LOCKED, [`SettleRewards::handle_chunk`] pays it on the same
//! transaction, the engine marks it settled and commits.

use std::sync::Arc;

use anyhow::Context;
use settled_engine::{
    runs, Chunk, ChunkHandler, ClaimedItem, Handled, HandlerError, LeasedHandler, QueueSpec, WorkQueue,
};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::address::CreatorAddress;
use crate::money::{Amount, FeeBps};
use crate::period::Period;
use crate::provider::{payout_key, PayoutProvider, ProviderError};

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
/// amount credited to the creator's balance, in one statement. `$4` is added
/// to the item's attempt to record the paying attempt: 1 in-transaction (the
/// attempt is raised when the chunk is marked settled), 0 leased (raised at
/// the claim). The ledger's
/// primary key refuses a second payment; balances are credited in creator
/// order so two chunks touching the same creators never deadlock.
pub const PAY_CHUNK_SQL: &str = "
WITH credited AS (
    INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
    SELECT v.period, v.creator, div(v.volume * p.fee_bps, 10000), $3, v.attempt + $4
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
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        let held = held_creators(&mut *tx, chunk).await?;
        let to_pay = chunk.with_items(chunk.items.iter().filter(|i| !held.contains(&i.key)).cloned().collect());
        if !to_pay.items.is_empty() {
            pay_chunk(tx, &to_pay, 1).await?;
        }
        // Simulated work after the writes and before the commit: the widest
        // window for a crash to leave something half written (it must not).
        if !self.work_per_item.is_zero() {
            tokio::time::sleep(self.work_per_item * chunk.items.len() as u32).await;
        }
        Ok(Handled { held })
    }
}

/// The chunk's creators with an active hold: not paid now.
async fn held_creators<'e, E: sqlx::PgExecutor<'e>>(conn: E, chunk: &Chunk) -> Result<Vec<String>, HandlerError> {
    Ok(sqlx::query_scalar(
        "SELECT creator FROM settlement.creator_holds WHERE released_at IS NULL AND creator = ANY($1)",
    )
    .bind(chunk.keys())
    .fetch_all(conn)
    .await?)
}

/// Writes a chunk's ledger rows and balance credits; refuses (so the caller
/// rolls back) unless every creator of the chunk was credited exactly once.
async fn pay_chunk(tx: &mut PgConnection, chunk: &Chunk, attempt_offset: i32) -> Result<(), HandlerError> {
    let credited = sqlx::query(PAY_CHUNK_SQL)
        .bind(&chunk.scope)
        .bind(chunk.keys())
        .bind(chunk.run_id)
        .bind(attempt_offset)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if credited != chunk.items.len() as u64 {
        return Err(HandlerError::Permanent(format!(
            "credited {credited} balances for {} claimed creators of period {}",
            chunk.items.len(),
            chunk.scope
        )));
    }
    Ok(())
}

/// The settlement handler for leased mode: each creator is paid through the
/// provider (idempotency key from period and creator) outside any
/// transaction; the ledger rows and balance credits of the items whose fence
/// still holds are written at completion.
pub struct SettleWithProvider<P> {
    /// The provider; None pays nothing outside (simulated work only).
    pub provider: Option<P>,
    /// Simulated work per item outside the transaction.
    pub work_per_item: std::time::Duration,
}

/// What leased settlement loads for a chunk.
pub struct LeasedBatch {
    amounts: std::collections::HashMap<String, Amount>,
    held: Vec<String>,
}

impl<P: PayoutProvider> LeasedHandler for SettleWithProvider<P> {
    type Batch = LeasedBatch;

    fn held(&self, batch: &LeasedBatch) -> Vec<String> {
        batch.held.clone()
    }

    async fn prepare(&self, pool: &PgPool, chunk: &Chunk) -> Result<Self::Batch, HandlerError> {
        let held = held_creators(pool, chunk).await?;
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT v.creator, div(v.volume * p.fee_bps, 10000)::text
             FROM settlement.token_trade_volume v
             JOIN settlement.settlement_policy p ON p.period = v.period
             WHERE v.period = $1::date AND v.creator = ANY($2)",
        )
        .bind(&chunk.scope)
        .bind(chunk.keys())
        .fetch_all(pool)
        .await?;
        let amounts = rows
            .into_iter()
            .map(|(creator, amount)| {
                Amount::parse_decimal(&amount)
                    .map(|a| (creator, a))
                    .map_err(|e| HandlerError::Permanent(format!("reward {amount:?} is not an amount: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(LeasedBatch { amounts, held })
    }

    async fn work_item(&self, batch: &Self::Batch, chunk: &Chunk, item: &ClaimedItem) -> Result<(), HandlerError> {
        if !self.work_per_item.is_zero() {
            tokio::time::sleep(self.work_per_item).await;
        }
        let Some(provider) = &self.provider else {
            return Ok(());
        };
        let amount = *batch.amounts.get(&item.key).ok_or_else(|| {
            HandlerError::Permanent(format!("creator {} has no reward for {}", item.key, chunk.scope))
        })?;
        let period = Period::parse(&chunk.scope).map_err(HandlerError::Permanent)?;
        match provider.pay(&payout_key(period, &item.key), &item.key, amount).await {
            Ok(_) => Ok(()),
            Err(ProviderError::Transient(e)) => Err(HandlerError::Transient(e)),
            Err(ProviderError::Refused(e)) => Err(HandlerError::Permanent(e)),
        }
    }

    async fn commit(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        pay_chunk(tx, chunk, 0).await
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
    .map_err(|e| match e.as_database_error().map(|d| d.message().to_string()) {
        Some(msg) if msg.contains("frozen") => anyhow::anyhow!("{msg}"),
        _ => anyhow::Error::new(e).context(format!("setting the policy of {period}")),
    })?;
    Ok(())
}

/// The period's fee, if a policy exists.
pub async fn policy(conn: &mut PgConnection, period: Period) -> anyhow::Result<Option<FeeBps>> {
    let bps: Option<i32> = sqlx::query_scalar("SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1")
        .bind(period.date())
        .fetch_optional(conn)
        .await?;
    bps.map(|b| FeeBps::new(b as u32).map_err(anyhow::Error::msg))
        .transpose()
}

/// Creates or joins the run for `period`. Refuses a period without a policy.
/// The policy row is held FOR SHARE while the run is inserted, so a
/// concurrent policy change either lands before the run or is refused.
pub async fn start_or_join_run(pool: &PgPool, period: Period, worker: Uuid) -> anyhow::Result<runs::Joined> {
    let mut tx = pool.begin().await?;
    let has_policy: Option<i32> =
        sqlx::query_scalar("SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1 FOR SHARE")
            .bind(period.date())
            .fetch_optional(&mut *tx)
            .await?;
    if has_policy.is_none() {
        // An existing run (say, from before a restore) may still be joined.
        if let Some(run) = runs::find(&mut tx, JOB, &period.to_string()).await? {
            tx.commit().await?;
            return Ok(runs::Joined { run, started: false });
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

/// Puts failed items of `period` back to `eligible` (all, or one creator's).
/// Their attempts so far stop counting toward the attempt limit
/// (`attempt_base`), while `attempt` itself, the fence, never goes down.
pub async fn retry_failed(pool: &PgPool, period: Period, creator: Option<&CreatorAddress>) -> anyhow::Result<u64> {
    let mut tx = pool.begin().await?;
    let retried = sqlx::query(
        "UPDATE settlement.token_trade_volume
         SET status = 'eligible', attempt_base = attempt, not_before = NULL, updated_at = now()
         WHERE period = $1 AND status = 'failed' AND ($2::text IS NULL OR creator = $2)",
    )
    .bind(period.date())
    .bind(creator.map(|c| c.as_str().to_string()))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if retried > 0 {
        // A finished run is reopened so workers settle what came back.
        let reopened = sqlx::query(
            "UPDATE settled_engine.runs SET state = 'running', finished_at = NULL, finished_by = NULL
             WHERE job = $1 AND period = $2 AND state = 'finished'",
        )
        .bind(JOB)
        .bind(period.to_string())
        .execute(&mut *tx)
        .await;
        if let Err(err) = reopened {
            if err
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|c| c == "23505")
            {
                anyhow::bail!(
                    "cannot reopen the run of {period} while another run of {JOB} is running; retry after it finishes"
                );
            }
            return Err(err.into());
        }
    }
    tx.commit().await?;
    Ok(retried)
}

/// The result of releasing a hold.
#[derive(Debug)]
pub enum Released {
    /// Released now: (id, creator, reason, created_at, released_at).
    Released(
        (
            i64,
            String,
            String,
            chrono::DateTime<chrono::Utc>,
            Option<chrono::DateTime<chrono::Utc>>,
        ),
    ),
    /// It had been released before.
    AlreadyReleased,
    /// No such hold.
    NotFound,
}

/// Releases hold `id` with a conditional update (one caller wins); the
/// creator's held items become eligible in the same transaction, and their
/// finished runs are reopened so workers pay them (once: the ledger's key).
pub async fn release_hold(pool: &PgPool, id: i64) -> anyhow::Result<Released> {
    let mut tx = pool.begin().await?;
    let row: Option<(
        i64,
        String,
        String,
        chrono::DateTime<chrono::Utc>,
        Option<chrono::DateTime<chrono::Utc>>,
    )> = sqlx::query_as(
        "UPDATE settlement.creator_holds SET released_at = now()
             WHERE id = $1 AND released_at IS NULL
             RETURNING id, creator, reason, created_at, released_at",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM settlement.creator_holds WHERE id = $1)")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        return Ok(if exists {
            Released::AlreadyReleased
        } else {
            Released::NotFound
        });
    };
    let periods: Vec<chrono::NaiveDate> = sqlx::query_scalar(
        "UPDATE settlement.token_trade_volume SET status = 'eligible', not_before = NULL, updated_at = now()
         WHERE creator = $1 AND status = 'held' RETURNING period",
    )
    .bind(&row.1)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    reopen_runs_with_work(pool, &periods).await;
    Ok(Released::Released(row))
}

/// Reopens finished runs of these periods (best effort: while another run of
/// the job is running, the worker daemons reopen them later).
pub async fn reopen_runs_with_work(pool: &PgPool, periods: &[chrono::NaiveDate]) {
    let mut periods = periods.to_vec();
    periods.sort();
    periods.dedup();
    for period in periods {
        let Ok(mut conn) = pool.acquire().await else { return };
        match runs::reopen(&mut conn, JOB, &period.to_string()).await {
            Ok(true) => tracing::info!(%period, "run reopened: items became eligible again"),
            Ok(false) => {}
            Err(err) => tracing::info!(%period, error = %err, "run not reopened yet"),
        }
    }
}

/// The oldest finished run that has eligible items again (a released hold,
/// a retry while another run ran), if any.
pub async fn finished_run_with_work(pool: &PgPool) -> anyhow::Result<Option<chrono::NaiveDate>> {
    Ok(sqlx::query_scalar(
        "SELECT r.period::date FROM settled_engine.runs r
         WHERE r.job = $1 AND r.state = 'finished'
           AND EXISTS (SELECT 1 FROM settlement.token_trade_volume v
                       WHERE v.period = r.period::date AND v.status = 'eligible')
         ORDER BY r.period LIMIT 1",
    )
    .bind(JOB)
    .fetch_optional(pool)
    .await?)
}
