//! What an operator changes: a period's fee, failed items retried, holds
//! released.

use sqlx::{PgConnection, PgPool};

use crate::address::CreatorAddress;
use crate::money::FeeBps;
use crate::period::Period;

use super::{job, POLICY_FROZEN};

/// Sets a period's fee. Refused (by a trigger, in the database) once a run
/// for the period exists.
pub(crate) async fn set_policy(pool: &PgPool, period: Period, fee: FeeBps) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO settlement.settlement_policy (period, fee_bps) VALUES ($1, $2)
         ON CONFLICT (period) DO UPDATE SET fee_bps = EXCLUDED.fee_bps, updated_at = now()",
    )
    .bind(period.date()) // $1
    .bind(i32::from(fee.get())) // $2
    .execute(pool)
    .await
    .map_err(|e| match e.as_database_error() {
        Some(db) if db.constraint() == Some(POLICY_FROZEN) => anyhow::anyhow!("{}", db.message()),
        _ => anyhow::Error::new(e).context(format!("setting the policy of {period}")),
    })?;
    Ok(())
}

/// Puts failed items of `period` back to `eligible` (all, or one creator's)
/// and reopens its finished run, on the caller's transaction; see
/// [`Job::retry_failed`](settled_engine::Job::retry_failed).
pub(crate) async fn retry_failed(
    tx: &mut PgConnection,
    period: Period,
    creator: Option<&CreatorAddress>,
) -> anyhow::Result<u64> {
    Ok(job()
        .retry_failed_in(tx, &period.to_string(), creator.map(CreatorAddress::as_str))
        .await?)
}

/// A hold as stored (and as the API shows it).
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub(crate) struct Hold {
    /// Hold id.
    pub id: i64,
    /// The held creator.
    pub creator: String,
    /// Why.
    pub reason: String,
    /// When it was placed.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it was released (null while active).
    #[schema(required = true)]
    pub released_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The result of releasing a hold.
#[derive(Debug)]
pub(crate) enum Released {
    /// Released now.
    Now(Hold),
    /// It had been released before.
    Before,
    /// No such hold.
    NotFound,
}

/// Releases hold `id` with a conditional update (one caller wins), on the
/// caller's transaction; the creator's held items become eligible in it.
/// Returns the periods that got work back: pass them to
/// [`reopen_released`] once it commits.
pub(crate) async fn release_hold(tx: &mut PgConnection, id: i64) -> anyhow::Result<(Released, Vec<String>)> {
    let hold: Option<Hold> = sqlx::query_as(
        "UPDATE settlement.creator_holds SET released_at = now()
         WHERE id = $1 AND released_at IS NULL
         RETURNING id, creator, reason, created_at, released_at",
    )
    .bind(id) // $1
    .fetch_optional(&mut *tx)
    .await?;
    let Some(hold) = hold else {
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM settlement.creator_holds WHERE id = $1)")
            .bind(id) // $1
            .fetch_one(&mut *tx)
            .await?;
        let released = if exists { Released::Before } else { Released::NotFound };
        return Ok((released, Vec::new()));
    };
    let periods = job().release_held(tx, &hold.creator).await?;
    Ok((Released::Now(hold), periods))
}

/// Reopens the finished runs of `periods` after a release committed, so
/// workers pay what it made eligible (once: the ledger's key).
pub(crate) async fn reopen_released(pool: &PgPool, periods: &[String]) {
    job().reopen_runs_with_work(pool, periods).await;
}
