//! The settlement job on the engine: its work table, its run hooks (a run
//! start closes the period's input, [`hold_input_open`], and needs the
//! period's policy, held FOR SHARE while the run starts; the report is the
//! period's exact status), and the handlers that pay a chunk (ledger rows
//! and balance credits in one set-based statement).
//!
//! The money path, top to bottom: the engine's chunk statement claims a
//! chunk with SKIP LOCKED, marks it settled (attempt + 1: each item's
//! fence) and runs [`CHUNK_EFFECTS_SQL`] on the rows it marked, all in one
//! statement; `settled_engine::drain` checks its counts and commits.

use std::sync::{Arc, OnceLock};

use anyhow::Context;

use settled_engine::{
    Chunk, ChunkHandler, EngineError, Handled, HandlerError, Job, LeasedHandler, QueueSpec, RunHooks,
};
use settled_engine::{ChunkSql, ClaimedItem, WorkQueue};
use sqlx::{PgConnection, PgPool};

use crate::address::CreatorAddress;
use crate::money::{Amount, FeeBps};
use crate::payouts::key_window::{self, Found, KeyUse};
use crate::period::Period;
use crate::provider::{payout_key, Payment, PaymentStatus, PayoutProvider, ProviderError};

/// The job's name in the engine's runs.
pub const JOB: &str = "creator-rewards";
/// The fee applied when a period is seeded without one.
pub const DEFAULT_FEE_BPS: u32 = 250;
/// The constraint name the policy-freeze trigger raises its refusal with.
pub const POLICY_FROZEN: &str = "settlement_policy_frozen_after_run";

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
    /// ([`hold_input_open`]) and keeps new ones out until it commits, so
    /// the run sees all the input there will ever be. It needs the period's
    /// policy; the policy row is held FOR SHARE while the run is inserted,
    /// so a concurrent policy change either lands before the run or is
    /// refused by the freeze trigger. The period's partitions are created
    /// if it has none yet (an archived period is refused).
    async fn before_start(&self, tx: &mut PgConnection, scope: &str) -> Result<(), EngineError> {
        let period = Period::parse(scope).map_err(EngineError::Config)?;
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
        let period = Period::parse(scope).map_err(EngineError::Config)?;
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
pub async fn hold_input_open(tx: &mut PgConnection, period: Period) -> anyhow::Result<()> {
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

/// What paying a chunk writes, the one home of that rule: one ledger row
/// per creator at the period's fee, recorded with the fence the engine gave
/// the claim (`attempt`), and the same amount credited to the creator's
/// balance. It reads the CTEs `settled` (period, creator, volume, attempt:
/// the items paid) and `run` (id); the last CTE, `effects`, returns one row
/// per credited creator. The engine's one-statement chunk puts it after the
/// claim and the marking (its `settled` is the rows it marked); the
/// several-statement path ([`pay_chunk_sql`]) after a look-up of the items.
/// The ledger's primary key refuses a second payment.
///
/// The balances are credited by an `UPDATE` of those that exist and a plain
/// `INSERT` of the others, not by `INSERT ... ON CONFLICT DO UPDATE`: no
/// speculative insertion and no lock of the conflicting row first, so less
/// WAL per creator (docs/benchmarks.md, "What the chunk statement's parts
/// cost"). Both see the statement's snapshot. A balance created by another
/// transaction meanwhile makes the insert fail on the key, and a balance
/// removed meanwhile makes the update miss it: either way the chunk rolls
/// back (the engine checks one effect per settled item) and is run again.
/// Chunks running at once hold distinct creators (one running run per job,
/// each item claimed once), so the update's row order cannot deadlock them.
pub const CHUNK_EFFECTS_SQL: &str = "
credited AS (
    INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
    SELECT s.period, s.creator, settlement.reward(s.volume, p.fee_bps), r.id, s.attempt
    FROM settled s
    JOIN settlement.settlement_policy p ON p.period = s.period
    CROSS JOIN run r
    ORDER BY s.creator
    RETURNING creator, amount
),
raised AS (
    UPDATE settlement.creator_balance b
    SET balance = b.balance + c.amount, updated_at = now()
    FROM credited c
    WHERE b.creator = c.creator
    RETURNING b.creator
),
opened AS (
    INSERT INTO settlement.creator_balance (creator, balance)
    SELECT c.creator, c.amount FROM credited c
    WHERE c.creator NOT IN (SELECT r.creator FROM raised r)
    ORDER BY c.creator
    RETURNING creator
),
effects AS (SELECT creator FROM raised UNION ALL SELECT creator FROM opened)";

/// The creators of the CTE `picked` with an active hold: not paid now. The
/// engine's one-statement chunk runs it over the rows it claimed; the
/// several-statement path over the chunk's keys (`held_creators`).
pub const CHUNK_HELD_SQL: &str = "SELECT h.creator AS key FROM settlement.creator_holds h
     WHERE h.released_at IS NULL AND h.creator IN (SELECT creator FROM picked)";

/// [`CHUNK_EFFECTS_SQL`] over a chunk's items looked up by key, for the
/// several-statement path (`handle_chunk`): $1 period, $2 creators, $3
/// run, $4 fences (beside the creators); answers the count of credited
/// creators. The items are looked up first (`OFFSET 0` keeps the planner
/// from folding the look-up into the join, where it would hash the whole
/// period per chunk), then matched with their fences.
pub fn pay_chunk_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH settled AS (
                 SELECT v.period, v.creator, v.volume, f.fence AS attempt
                 FROM (SELECT t.period, t.creator, t.volume FROM settlement.token_trade_volume t
                       WHERE t.period = $1 AND t.creator = ANY($2) OFFSET 0) v
                 JOIN unnest($2::text[], $4::integer[]) AS f(creator, fence) ON f.creator = v.creator
             ),
             run AS (SELECT $3::bigint AS id),
             {CHUNK_EFFECTS_SQL}
             SELECT count(*) FROM effects"
        )
    });
    &SQL
}

/// [`CHUNK_HELD_SQL`] over a chunk's keys ($1).
fn held_creators_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("WITH picked AS (SELECT unnest($1::text[]) AS creator) {CHUNK_HELD_SQL}"));
    &SQL
}

/// The settlement handler for in-transaction mode. The engine runs each
/// chunk as one statement with [`CHUNK_EFFECTS_SQL`]; `handle_chunk` does
/// the same in separate statements (for wrappers that add work per item).
#[derive(Debug, Clone, Copy, Default)]
pub struct SettleRewards;

impl ChunkHandler for SettleRewards {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        let held = held_creators(&mut *tx, chunk).await?;
        let to_pay = chunk.with_items(chunk.items.iter().filter(|i| !held.contains(&i.key)).cloned().collect());
        if !to_pay.items.is_empty() {
            pay_chunk(tx, &to_pay).await?;
        }
        Ok(Handled { held })
    }

    fn chunk_sql(&self) -> Option<ChunkSql> {
        Some(ChunkSql {
            effects: CHUNK_EFFECTS_SQL.into(),
            held: Some(CHUNK_HELD_SQL.into()),
        })
    }
}

/// The chunk's creators with an active hold: not paid now.
async fn held_creators<'e, E: sqlx::PgExecutor<'e>>(conn: E, chunk: &Chunk) -> Result<Vec<String>, HandlerError> {
    Ok(sqlx::query_scalar(held_creators_sql())
        .bind(chunk.keys()) // $1
        .fetch_all(conn)
        .await?)
}

/// Writes a chunk's ledger rows and balance credits; refuses (so the caller
/// rolls back) unless every creator of the chunk was credited exactly once.
async fn pay_chunk(tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
    let period = Period::parse(&chunk.scope).map_err(HandlerError::Permanent)?;
    let credited: i64 = sqlx::query_scalar(pay_chunk_sql())
        .bind(period.date()) // $1
        .bind(chunk.keys()) // $2
        .bind(chunk.run_id) // $3
        .bind(chunk.fences()) // $4
        .fetch_one(&mut *tx)
        .await?;
    if credited != chunk.items.len() as i64 {
        return Err(HandlerError::Permanent(format!(
            "credited {credited} balances for {} claimed creators of period {}",
            chunk.items.len(),
            chunk.scope
        )));
    }
    Ok(())
}

/// The settlement handler for leased mode: each creator is paid through the
/// provider (idempotency key from period and creator, the key its
/// reference too) outside any transaction; at completion, for the items
/// whose fence still holds, the ledger rows and balance credits, and each
/// payment as a payout of the credited reward (`kind = 'settlement'`,
/// debited at once) in the state the provider answered: `sent`, `paid`, or
/// `failed` with the reward back on the balance. A payment that fails or
/// comes back later (its webhook, a lookup) returns the reward to the
/// balance the same way, so money is never lost. A key first used longer
/// ago than the provider's key window is not sent under again before the
/// payment is found by its reference (`payouts::key_window`).
#[derive(Debug, Clone)]
pub struct SettleWithProvider<P> {
    /// The provider.
    pub provider: P,
    /// The provider's answers, by payout key, from the work to the
    /// completion (an answer lost on the way records the payment `sent`,
    /// and a lookup settles it).
    answers: Arc<std::sync::Mutex<std::collections::HashMap<String, (Payment, std::time::Instant)>>>,
    /// How long the provider keeps a key.
    key_window: std::time::Duration,
}

/// Answers kept at most this long for a completion (a completion refused
/// by the fence never takes its answer).
const ANSWER_KEPT: std::time::Duration = std::time::Duration::from_secs(3_600);

impl<P> SettleWithProvider<P> {
    /// A handler paying through `provider`, which keeps keys
    /// [`key_window::DEFAULT_PROVIDER_KEY_WINDOW`].
    pub fn new(provider: P) -> SettleWithProvider<P> {
        SettleWithProvider {
            provider,
            answers: Arc::default(),
            key_window: key_window::DEFAULT_PROVIDER_KEY_WINDOW,
        }
    }

    /// The same handler, for a provider that keeps keys `window`.
    pub fn with_key_window(self, window: std::time::Duration) -> SettleWithProvider<P> {
        SettleWithProvider {
            key_window: window,
            ..self
        }
    }

    fn keep(&self, key: String, payment: Payment) {
        let mut answers = self.answers.lock().expect("answers");
        if answers.len() > 10_000 {
            answers.retain(|_, (_, at)| at.elapsed() < ANSWER_KEPT);
        }
        answers.insert(key, (payment, std::time::Instant::now()));
    }

    fn take(&self, key: &str) -> Option<Payment> {
        self.answers.lock().expect("answers").remove(key).map(|(p, _)| p)
    }
}

/// What leased settlement loads for a chunk.
pub struct LeasedBatch {
    period: Period,
    amounts: std::collections::HashMap<String, Amount>,
    held: Vec<String>,
    /// What settled knows of each payment key, its first use noted before
    /// any call under it.
    keys: std::collections::HashMap<String, KeyUse>,
    pool: PgPool,
}

#[derive(sqlx::FromRow)]
struct RewardRow {
    creator: String,
    reward: String,
}

impl<P: PayoutProvider> LeasedHandler for SettleWithProvider<P> {
    type Batch = LeasedBatch;

    fn held(&self, batch: &LeasedBatch) -> Vec<String> {
        batch.held.clone()
    }

    async fn prepare(&self, pool: &PgPool, chunk: &Chunk) -> Result<Self::Batch, HandlerError> {
        let period = Period::parse(&chunk.scope).map_err(HandlerError::Permanent)?;
        let held = held_creators(pool, chunk).await?;
        let rows: Vec<RewardRow> = sqlx::query_as(
            "SELECT v.creator, settlement.reward(v.volume, p.fee_bps)::text AS reward
             FROM settlement.token_trade_volume v
             JOIN settlement.settlement_policy p ON p.period = v.period
             WHERE v.period = $1 AND v.creator = ANY($2)",
        )
        .bind(period.date()) // $1
        .bind(chunk.keys()) // $2
        .fetch_all(pool)
        .await?;
        let amounts = rows
            .into_iter()
            .map(|row| {
                Amount::parse_decimal(&row.reward)
                    .map(|a| (row.creator, a))
                    .map_err(|e| HandlerError::Permanent(format!("reward {:?} is not an amount: {e}", row.reward)))
            })
            .collect::<Result<_, _>>()?;
        let keys: Vec<String> = chunk
            .items
            .iter()
            .filter(|i| !held.contains(&i.key))
            .map(|i| payout_key(period, &i.key))
            .collect();
        let keys = key_window::note_uses(pool, &keys)
            .await
            .map_err(|e| HandlerError::Transient(format!("noting the chunk's payment keys: {e:#}")))?;
        Ok(LeasedBatch {
            period,
            amounts,
            held,
            keys,
            pool: pool.clone(),
        })
    }

    async fn work_item(&self, batch: &Self::Batch, chunk: &Chunk, item: &ClaimedItem) -> Result<(), HandlerError> {
        let amount = *batch.amounts.get(&item.key).ok_or_else(|| {
            HandlerError::Permanent(format!("creator {} has no reward for {}", item.key, chunk.scope))
        })?;
        let key = payout_key(batch.period, &item.key);
        if let Some(payment) = self.found_past_window(batch, &key, &item.key, amount).await? {
            self.keep(key, payment);
            return Ok(());
        }
        match self.provider.pay(&key, &item.key, amount, Some(&key)).await {
            Ok((payment, _)) => {
                self.keep(key, payment);
                Ok(())
            }
            Err(e) => Err(item_error(e)),
        }
    }

    async fn commit(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        pay_chunk(tx, chunk).await?;
        record_payments(tx, chunk, |key| self.take(key)).await
    }
}

impl<P: PayoutProvider> SettleWithProvider<P> {
    /// Key `key`'s payment of `amount` to `creator`, found by its reference
    /// when the key is past the provider's key window; None when it is
    /// not past (or the provider certainly has none): the payment is sent.
    /// Err when nothing may be sent: the key waits for an operator (or the
    /// provider cannot answer now).
    async fn found_past_window(
        &self,
        batch: &LeasedBatch,
        key: &str,
        creator: &str,
        amount: Amount,
    ) -> Result<Option<Payment>, HandlerError> {
        // A key missing from the batch was not noted: taken as past the window.
        let noted = batch.keys.get(key).cloned().unwrap_or_else(KeyUse::unknown);
        if let Some(detail) = noted.awaiting_operator {
            return Err(HandlerError::Permanent(key_window::waits(key, &detail)));
        }
        // Asked right before the call: the chunk's items wait their turn.
        if !noted.past(self.key_window) {
            return Ok(None);
        }
        let detail = match key_window::judge(key, self.provider.find_by_reference(key).await) {
            Found::Nothing => return Ok(None),
            Found::Payment(payment) if key_window::is_owed(&payment, key, creator, amount) => return Ok(Some(payment)),
            Found::Later(error) => return Err(item_error(error)),
            Found::Payment(payment) => format!(
                "the provider's payment {} for reference {key:?} is not the one owed (under key {:?}, {} to {})",
                payment.id, payment.idempotency_key, payment.amount, payment.creator
            ),
            Found::CannotSay(detail) => detail,
        };
        key_window::await_operator(&batch.pool, key, &detail)
            .await
            .map_err(|e| HandlerError::Transient(format!("recording key {key}'s wait: {e:#}")))?;
        Err(HandlerError::Permanent(key_window::waits(key, &detail)))
    }
}

/// Records each paid item's payment as a payout of its reward (debited at
/// once), in the state `answer` gives (none: `sent`, for a lookup to
/// settle), on the completion's transaction, after its ledger rows and
/// credits. Rewards of zero pay nothing and record nothing.
async fn record_payments(
    tx: &mut PgConnection,
    chunk: &Chunk,
    answer: impl Fn(&str) -> Option<Payment>,
) -> Result<(), HandlerError> {
    let period = Period::parse(&chunk.scope).map_err(HandlerError::Permanent)?;
    let (mut creators, mut keys, mut ids, mut states, mut reasons) = (vec![], vec![], vec![], vec![], vec![]);
    for item in &chunk.items {
        let key = payout_key(period, &item.key);
        let payment = answer(&key);
        let (state, reason) = match payment.as_ref().map(|p| p.status) {
            Some(PaymentStatus::Paid) => ("paid", "paid at once".to_string()),
            Some(PaymentStatus::Failed) => (
                "failed",
                format!(
                    "failed: {}",
                    payment
                        .as_ref()
                        .and_then(|p| p.failure_reason.clone())
                        .unwrap_or_default()
                ),
            ),
            Some(PaymentStatus::Pending) => ("sent", "accepted by the provider".to_string()),
            // Found, long after, paid and returned: a look-up moves it on.
            Some(PaymentStatus::Returned) | None => {
                ("sent", "accepted by the provider; its answer is looked up".to_string())
            }
        };
        creators.push(item.key.clone());
        keys.push(key);
        ids.push(payment.map(|p| p.id));
        states.push(state);
        reasons.push(reason);
    }
    sqlx::query(&format!(
        "{} SELECT settlement.record_settlement_payment(l.creator, l.amount, l.period, a.key, a.id, a.state, a.reason)
         FROM mover, settlement.reward_ledger l
         JOIN unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS a(creator, key, id, state, reason)
           ON a.creator = l.creator
         WHERE l.period = $1 AND l.amount > 0",
        crate::payouts::with_mover(7)
    ))
    .bind(period.date()) // $1
    .bind(creators) // $2
    .bind(keys) // $3
    .bind(ids) // $4
    .bind(states) // $5
    .bind(reasons) // $6
    .bind(crate::payouts::MOVED_BY_SETTLEMENT) // $7
    .execute(tx)
    .await?;
    Ok(())
}

/// How a provider call that failed ends a settlement item's attempt: a
/// refusal or a key conflict fails it, a rate limit waits as asked, anything
/// else is retried later under the same key.
pub fn item_error(error: ProviderError) -> HandlerError {
    match error {
        ProviderError::Transient(e) => HandlerError::Transient(e),
        ProviderError::RateLimited { retry_after } => HandlerError::Snooze {
            after: retry_after,
            reason: error.to_string(),
        },
        ProviderError::Refused(e) | ProviderError::KeyConflict(e) => HandlerError::Permanent(e),
    }
}

/// Sets a period's fee. Refused (by a trigger, in the database) once a run
/// for the period exists.
pub async fn set_policy(pool: &PgPool, period: Period, fee: FeeBps) -> anyhow::Result<()> {
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

/// The period's fee, if a policy exists.
pub async fn policy(conn: &mut PgConnection, period: Period) -> anyhow::Result<Option<FeeBps>> {
    let bps: Option<i32> = sqlx::query_scalar("SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1")
        .bind(period.date()) // $1
        .fetch_optional(conn)
        .await?;
    bps.map(|b| FeeBps::new(b as u32).map_err(anyhow::Error::msg))
        .transpose()
}

/// Puts failed items of `period` back to `eligible` (all, or one creator's)
/// and reopens its finished run, on the caller's transaction; see
/// [`Job::retry_failed`].
pub async fn retry_failed(
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
pub struct Hold {
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
pub enum Released {
    /// Released now.
    Released(Hold),
    /// It had been released before.
    AlreadyReleased,
    /// No such hold.
    NotFound,
}

/// Releases hold `id` with a conditional update (one caller wins), on the
/// caller's transaction; the creator's held items become eligible in it.
/// Returns the periods that got work back: pass them to
/// [`reopen_released`] once it commits.
pub async fn release_hold(tx: &mut PgConnection, id: i64) -> anyhow::Result<(Released, Vec<String>)> {
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
        let released = if exists {
            Released::AlreadyReleased
        } else {
            Released::NotFound
        };
        return Ok((released, Vec::new()));
    };
    let periods = job().release_held(tx, &hold.creator).await?;
    Ok((Released::Released(hold), periods))
}

/// Reopens the finished runs of `periods` after a release committed, so
/// workers pay what it made eligible (once: the ledger's key).
pub async fn reopen_released(pool: &PgPool, periods: &[String]) {
    job().reopen_runs_with_work(pool, periods).await;
}
