//! The settlement job on the engine: its work table, its run hooks (a run
//! start closes the period's input, `hold_input_open`, and needs the
//! period's policy, held FOR SHARE while the run starts; the report is the
//! period's exact status), and the handlers that pay a chunk (ledger rows
//! and balance credits in one set-based statement).
//!
//! The money path, top to bottom: the engine's chunk statement claims a
//! chunk with SKIP LOCKED, marks it settled (attempt + 1: each item's
//! fence) and runs `CHUNK_EFFECTS_SQL` on the
//! rows it marked, all in one statement; `settled_engine::drain` checks its
//! counts and commits.

mod chunk;
mod leased;
mod operator;

pub use chunk::SettleRewards;
pub use leased::{item_error, LeasedBatch, SettleWithProvider};
pub(crate) use operator::{release_hold, reopen_released, retry_failed, set_policy, Hold, Released};

use std::sync::{Arc, OnceLock};

use anyhow::Context;

use settled_engine::WorkQueue;
use settled_engine::{Chunk, EngineError, HandlerError, Job, QueueSpec, RunHooks};
use sqlx::PgConnection;

use crate::period::Period;

/// The job's name in the engine's runs.
pub(crate) const JOB: &str = "creator-rewards";
/// The fee applied when a period is seeded without one.
pub(crate) const DEFAULT_FEE_BPS: u32 = 250;
/// The constraint name the policy-freeze trigger raises its refusal with.
pub(crate) const POLICY_FROZEN: &str = "settlement_policy_frozen_after_run";

/// The settlement job: its work table and its hooks.
pub fn job() -> &'static Job<Settlement> {
    static JOB_DECL: OnceLock<Job<Settlement>> = OnceLock::new();
    JOB_DECL.get_or_init(|| {
        let queue = WorkQueue::new(QueueSpec {
            job: JOB.into(),
            table: "settlement.token_trade_volume".into(),
            scope_column: "period".into(),
            scope_type: "date".into(),
            key_column: "creator".into(),
            key_type: "text".into(),
        })
        .expect("the settlement queue spec is valid");
        Job::new(queue, Settlement)
    })
}

/// The settlement work table as an engine queue.
pub fn queue() -> Arc<WorkQueue> {
    job().queue().clone()
}

/// Settlement's hooks into the engine's run lifecycle.
#[derive(Debug, Clone, Copy)]
pub struct Settlement;

impl RunHooks for Settlement {
    /// A run start first waits for every writer of the period's input
    /// (`hold_input_open`) and keeps new ones out until it commits, so
    /// the run sees all the input there will ever be. It needs the period's
    /// policy; the policy row is held FOR SHARE while the run is inserted,
    /// so a concurrent policy change either lands before the run or is
    /// refused by the freeze trigger. The period's partitions are created
    /// if it has none yet (an archived period is refused).
    async fn before_start(&self, tx: &mut PgConnection, scope: &str) -> Result<(), EngineError> {
        let period = run_period(scope)?;
        sqlx::query(CLOSE_INPUT_SQL)
            .bind(period.date()) // $1
            .execute(&mut *tx)
            .await
            .map_err(EngineError::db("closing the period's input"))?;
        let fee: Option<i32> =
            sqlx::query_scalar("SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1 FOR SHARE")
                .bind(period.date()) // $1
                .fetch_optional(&mut *tx)
                .await
                .map_err(EngineError::db("reading the period's policy"))?;
        match fee {
            Some(_) => crate::partitions::ensure(tx, period)
                .await
                .map(|_| ())
                .map_err(|e| EngineError::StartRefused {
                    job: JOB.into(),
                    scope: scope.into(),
                    reason: format!("{e:#}"),
                }),
            None => Err(EngineError::StartRefused {
                job: JOB.into(),
                scope: scope.into(),
                reason: format!(
                    "period {period} has no settlement policy: set one with `settled policy --period {period} --fee-bps B`"
                ),
            }),
        }
    }

    async fn report(
        &self,
        tx: &mut PgConnection,
        _queue: &WorkQueue,
        scope: &str,
    ) -> Result<serde_json::Value, EngineError> {
        let period = run_period(scope)?;
        let status = crate::status::period_status_in_tx(tx, period)
            .await
            .map_err(|e| EngineError::Invariant(format!("computing the report of {period}: {e:#}")))?;
        Ok(serde_json::json!({
            "items": status.total,
            "counts": status.counts.to_json(),
            "paid": status.settled_amount,
            "expected": status.expected_amount,
        }))
    }

    /// A due time at 05:00 settles the day before.
    fn scope_for_due(&self, local_date: chrono::NaiveDate) -> String {
        Period::from_date(local_date - chrono::Duration::days(1)).to_string()
    }
}

/// The period a run's scope names. The engine hands the scope to the job as
/// text, at each of its calls (a hook of the run, a handler's chunk): the
/// call parses it here, once, and passes the [`Period`] down. A scope that
/// is not a period is a configuration error of the run.
fn run_period(scope: &str) -> Result<Period, EngineError> {
    Period::parse(scope).map_err(EngineError::Config)
}

/// The period of a chunk's scope ([`run_period`]); a chunk whose scope is
/// not a period fails for good.
fn chunk_period(chunk: &Chunk) -> Result<Period, HandlerError> {
    Period::parse(&chunk.scope).map_err(HandlerError::Permanent)
}

/// The advisory lock of a period's input ($1: the period), apart from every
/// other lock of settled by its name. Not the policy row: input usually
/// arrives before the period has a policy.
macro_rules! period_input_lock {
    () => {
        "(hashtext('settled period input'), $1::date - DATE '2000-01-01')"
    };
}

/// Taken by a run start, exclusive: it waits for the writers of the input.
const CLOSE_INPUT_SQL: &str = concat!("SELECT pg_advisory_xact_lock", period_input_lock!());
/// Taken by each writer of the input, shared: writers do not wait for each other.
const HOLD_INPUT_SQL: &str = concat!("SELECT pg_advisory_xact_lock_shared", period_input_lock!());

/// Holds `period`'s input open until `tx` ends: no run of the period can
/// start meanwhile (a run start waits), so rows written in `tx` are seen by
/// its run. Refused when the period already has a run, whatever its state.
/// Every writer of a period's items (seed, import) calls this first.
pub(crate) async fn hold_input_open(tx: &mut PgConnection, period: Period) -> anyhow::Result<()> {
    sqlx::query(HOLD_INPUT_SQL)
        .bind(period.date()) // $1
        .execute(&mut *tx)
        .await
        .with_context(|| format!("holding the input of {period} open"))?;
    if let Some(run) = job().find_run(&mut *tx, &period.to_string()).await? {
        anyhow::bail!(
            "period {period} already has run {} ({}): its input can no longer change",
            run.id,
            run.state.as_str()
        );
    }
    Ok(())
}
