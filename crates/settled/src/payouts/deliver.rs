//! Delivery: payouts leave the database exactly once. Leased workers serve
//! the delivery queue (one job per queued payout, committed with its
//! debit); each call to the provider carries the payout's provider key, the
//! same on every retry, after any crash, from any worker or failover, so
//! the provider applies it once; the provider's answer moves the payout in
//! the completion's transaction, which the lease's fence guards.
//!
//! The provider's limits hold for the whole fleet, in the database: a
//! token bucket of calls per second, and a "down until" that every worker
//! honours after the provider failed, raised once per outage (not per
//! caller). A job that cannot call now, or whose creator is on hold, is
//! snoozed: it spends no attempt, and nothing spins. A refusal fails the
//! payout and returns its funds; a payment id another payout holds is a
//! conflict and a dead letter, never a completion that fails again.
//! Before a call under a key first used longer ago than the provider's
//! key window, the payment is found by its reference instead
//! (`key_window.rs`): sent again only when the provider certainly has
//! none. Beside the workers: payouts sent long ago, and those paid within
//! the returns watch, are looked up (a lost webhook, a return), and
//! unconfirmed ones expire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use settled_engine::{ClaimedJob, HandlerError, LeasedJobHandler};

use super::key_window::{self, Found, DEFAULT_PROVIDER_KEY_WINDOW};
use super::word::{self, Reading};
use super::{apply_word, fail_refused, record_payment_clash, PayoutRow, PayoutState, ProviderWord, Rail, Source};
use crate::provider::{Payment, ProviderError};

/// The fleet's limits on calls to one provider.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The provider's name in `settlement.provider_limits`.
    pub name: String,
    /// Calls per second, over every worker.
    pub per_second: f64,
    /// Calls that may go at once after a quiet spell.
    pub burst: f64,
    /// First wait after the provider failed, in milliseconds (doubles per
    /// outage window, up to `down_cap_ms`).
    pub down_base_ms: i32,
    /// Longest wait.
    pub down_cap_ms: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            name: "default".into(),
            per_second: 1_000.0,
            burst: 1_000.0,
            down_base_ms: 500,
            down_cap_ms: 30_000,
        }
    }
}

/// This process's share of the fleet's calls: taken from the database's
/// bucket a tenth of a second's worth at a time, so the bucket's row is
/// written a few times a second per process, not once per call. One task
/// at a time takes from the bucket; the others wait for its grant and share
/// it (each taking from the bucket itself queued every call in flight on
/// the bucket's row lock, and each grant replaced the one before).
pub struct Limiter {
    pool: PgPool,
    limits: Limits,
    local: Mutex<Budget>,
    refill: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Budget {
    calls: u32,
    down_until: Option<Instant>,
    /// The bucket was empty: no call before then.
    empty_until: Option<Instant>,
    /// This process saw the provider down: the next success says it is up.
    saw_down: bool,
}

impl Budget {
    /// A call from what this process holds: allowed, a wait, or None (ask
    /// the bucket).
    fn take(&mut self) -> Option<Result<(), Duration>> {
        let now = Instant::now();
        if let Some(until) = self.down_until.filter(|u| *u > now) {
            return Some(Err(until - now));
        }
        if self.calls > 0 {
            self.calls -= 1;
            return Some(Ok(()));
        }
        self.empty_until.filter(|u| *u > now).map(|until| Err(until - now))
    }
}

#[derive(sqlx::FromRow)]
struct Grant {
    granted: i32,
    wait_secs: f64,
    down_secs: Option<f64>,
}

impl Limiter {
    /// A limiter over `limits`, shared by the fleet through `pool`'s database.
    pub fn new(pool: PgPool, limits: Limits) -> Limiter {
        Limiter {
            pool,
            limits,
            local: Mutex::new(Budget::default()),
            refill: tokio::sync::Mutex::new(()),
        }
    }

    /// One call's permission, or how long to wait for it.
    pub async fn take(&self) -> anyhow::Result<Result<(), Duration>> {
        if let Some(answer) = self.local.lock().expect("budget").take() {
            return Ok(answer);
        }
        let _refilling = self.refill.lock().await;
        // Another task may have refilled while this one waited.
        if let Some(answer) = self.local.lock().expect("budget").take() {
            return Ok(answer);
        }
        let wanted = (self.limits.per_second / 10.0).ceil().max(1.0) as i32;
        let grant: Grant = sqlx::query_as(
            "SELECT granted, wait_secs,
                    extract(epoch FROM g.down_until - clock_timestamp())::float8 AS down_secs
             FROM settlement.take_provider_calls($1, $2, $3, $4) g",
        )
        .bind(&self.limits.name) // $1
        .bind(wanted) // $2
        .bind(self.limits.per_second) // $3
        .bind(self.limits.burst) // $4
        .fetch_one(&self.pool)
        .await?;
        let mut local = self.local.lock().expect("budget");
        local.down_until = grant
            .down_secs
            .filter(|s| *s > 0.0)
            .map(|s| Instant::now() + Duration::from_secs_f64(s));
        if let Some(until) = local.down_until {
            // The calls granted stay in the budget for after the outage.
            local.calls += grant.granted.max(0) as u32;
            return Ok(Err(until - Instant::now()));
        }
        if grant.granted > 0 {
            local.calls += grant.granted as u32 - 1;
            local.empty_until = None;
            return Ok(Ok(()));
        }
        let wait = Duration::from_secs_f64(grant.wait_secs.clamp(0.001, 60.0));
        local.empty_until = Some(Instant::now() + wait);
        Ok(Err(wait))
    }

    /// The provider failed as if down: the fleet waits; returns how long.
    pub async fn down(&self) -> anyhow::Result<Duration> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM settlement.provider_down($1, $2, $3) - clock_timestamp())::float8",
        )
        .bind(&self.limits.name) // $1
        .bind(self.limits.down_base_ms) // $2
        .bind(self.limits.down_cap_ms) // $3
        .fetch_one(&self.pool)
        .await?;
        let wait = Duration::from_secs_f64(secs.unwrap_or(0.0).max(0.05));
        let mut local = self.local.lock().expect("budget");
        local.down_until = Some(Instant::now() + wait);
        local.saw_down = true;
        Ok(wait)
    }

    /// The provider answered: if this process saw it down, the fleet's wait ends.
    pub async fn up(&self) -> anyhow::Result<()> {
        let saw_down = std::mem::take(&mut self.local.lock().expect("budget").saw_down);
        if saw_down {
            sqlx::query("SELECT settlement.provider_up($1)")
                .bind(&self.limits.name) // $1
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }
}

/// What a delivery learned, for its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The provider's word about the payment.
    Word(ProviderWord),
    /// The provider will never pay it (a 4xx refusal).
    Refused(String),
    /// The payout had left `queued` already (a webhook was first).
    Nothing,
}

/// A queued payout, as delivery reads it.
#[derive(sqlx::FromRow)]
struct ToDeliver {
    #[sqlx(flatten)]
    payout: PayoutRow,
    /// The creator's active hold, if any: nothing is sent meanwhile.
    active_hold: Option<i64>,
}

/// How long a payout whose creator is on hold waits before delivery looks
/// at its hold again (a snooze: it spends no attempt).
pub const HOLD_RECHECK: Duration = Duration::from_secs(5);

/// The delivery handler: sends each queued payout through its rail.
pub struct Deliver<R> {
    rail: R,
    pool: PgPool,
    limiter: Arc<Limiter>,
    key_window: Duration,
}

impl<R: Rail> Deliver<R> {
    /// A handler sending through `rail`, within the fleet's `limiter`,
    /// for a provider that keeps keys [`DEFAULT_PROVIDER_KEY_WINDOW`].
    pub fn new(rail: R, pool: PgPool, limiter: Arc<Limiter>) -> Deliver<R> {
        Deliver {
            rail,
            pool,
            limiter,
            key_window: DEFAULT_PROVIDER_KEY_WINDOW,
        }
    }

    /// The same handler, for a provider that keeps keys `window`.
    pub fn with_key_window(self, window: Duration) -> Deliver<R> {
        Deliver {
            key_window: window,
            ..self
        }
    }

    /// The rail's answer for `payout`: its payment sent (again) under its
    /// key, unless the key is past the provider's key window; then the
    /// payment found by its reference, sent again only when the provider
    /// certainly has none. Err when nothing may be sent: the key waits for
    /// an operator.
    async fn answer(
        &self,
        payout: &PayoutRow,
        traceparent: Option<&str>,
    ) -> Result<Result<Payment, ProviderError>, HandlerError> {
        if !R::KEYS_EXPIRE {
            return Ok(self.rail.send(payout, traceparent).await);
        }
        let key = &payout.provider_key;
        let key_use = key_window::note_use(&self.pool, key)
            .await
            .map_err(|e| HandlerError::Transient(format!("noting the use of key {key}: {e:#}")))?;
        if let Some(detail) = key_use.awaiting_operator {
            return Err(HandlerError::Permanent(format!(
                "payout {}: {}",
                payout.id,
                key_window::waits(key, &detail)
            )));
        }
        if !key_use.past(self.key_window) {
            return Ok(self.rail.send(payout, traceparent).await);
        }
        match key_window::judge(&payout.reference, self.rail.find(payout).await) {
            Found::Nothing => Ok(self.rail.send(payout, traceparent).await),
            Found::Payment(payment) => Ok(Ok(payment)),
            Found::Later(error) => Ok(Err(error)),
            Found::CannotSay(detail) => {
                key_window::await_operator(&self.pool, key, &detail)
                    .await
                    .map_err(|e| HandlerError::Transient(format!("recording key {key}'s wait: {e:#}")))?;
                Err(HandlerError::Permanent(format!(
                    "payout {}: {}",
                    payout.id,
                    key_window::waits(key, &detail)
                )))
            }
        }
    }
}

impl<R> Deliver<R> {
    async fn load(&self, id: i64) -> Result<Option<ToDeliver>, HandlerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {}, (SELECT h.id FROM settlement.creator_holds h
                         WHERE h.creator = p.creator AND h.released_at IS NULL) AS active_hold
             FROM settlement.payouts p WHERE p.id = $1",
            super::PAYOUT_COLUMNS
        ))
        .bind(id) // $1
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A payment whose id another payout holds (a provider that restarted
    /// its ids, a bridge moved to another provider) cannot be recorded: it
    /// is a conflict for operators, and the job a dead letter that says so,
    /// rather than a completion that fails on every retry.
    async fn refuse_clash(&self, id: i64, word: &ProviderWord) -> Result<(), HandlerError> {
        let Some(payment_id) = word.provider_id() else {
            return Ok(());
        };
        let mut conn = self.pool.acquire().await?;
        let clash = record_payment_clash(&mut conn, id, payment_id, word.provider_status(), Source::Delivery)
            .await
            .map_err(|e| HandlerError::Transient(format!("checking payout {id}'s payment id: {e:#}")))?;
        match clash {
            None => Ok(()),
            Some(clash) => Err(HandlerError::Permanent(format!(
                "payout {id}: {clash}; recorded as a conflict, the payout stays queued with its funds held"
            ))),
        }
    }

    /// Records in `settlement.payout_conflicts` that the provider answered
    /// payout `id`'s key with `payment`, which is not its payment.
    async fn record_conflict(&self, id: i64, payment: &Payment) -> Result<(), HandlerError> {
        let mut conn = self.pool.acquire().await?;
        super::payment_matches(&mut conn, id, payment, Source::Delivery, None)
            .await
            .map_err(|e| HandlerError::Transient(format!("recording payout {id}'s conflict: {e:#}")))?;
        Ok(())
    }

    /// What the rail's answer about `payout`, read, makes of its job.
    async fn act_on(&self, payout: &PayoutRow, reading: Reading) -> Result<Delivered, HandlerError> {
        let id = payout.id;
        match reading {
            Reading::Word(word) => {
                self.limiter
                    .up()
                    .await
                    .map_err(|e| HandlerError::Transient(e.to_string()))?;
                self.refuse_clash(id, &word).await?;
                Ok(Delivered::Word(word))
            }
            Reading::NotItsPayment { payment, detail } => {
                // The rail answered the payout's key with another payment
                // (another key, creator or amount): nothing is applied, the
                // payout stays queued with its funds held, the conflict is
                // recorded, and the job is a dead letter for operators
                // (reconcile names the payout).
                self.record_conflict(id, &payment).await?;
                Err(HandlerError::Permanent(format!("payout {id}: {detail}")))
            }
            Reading::RateLimited(wait) => Err(snooze(wait, "the provider is rate limiting")),
            Reading::Unavailable(why) => {
                let wait = self
                    .limiter
                    .down()
                    .await
                    .map_err(|e| HandlerError::Transient(e.to_string()))?;
                Err(snooze(wait, format!("the provider is unavailable: {why}")))
            }
            Reading::Refused(why) => Ok(Delivered::Refused(why)),
            Reading::KeyConflict(why) => Err(HandlerError::Permanent(format!(
                "the provider has key {} for a different request: {why}",
                payout.provider_key
            ))),
        }
    }
}

fn payout_of(job: &ClaimedJob) -> Result<i64, HandlerError> {
    job.key
        .parse()
        .map_err(|_| HandlerError::Permanent(format!("delivery job {:?} is not a payout id", job.key)))
}

fn snooze(after: Duration, reason: impl Into<String>) -> HandlerError {
    HandlerError::Snooze {
        after,
        reason: reason.into(),
    }
}

impl<R: Rail> LeasedJobHandler for Deliver<R> {
    type Output = Delivered;

    async fn work(&self, job: &ClaimedJob) -> Result<Delivered, HandlerError> {
        let id = payout_of(job)?;
        let Some(ToDeliver { payout, active_hold }) = self.load(id).await? else {
            return Err(HandlerError::Permanent(format!("payout {id} does not exist")));
        };
        if payout.state != PayoutState::Queued {
            return Ok(Delivered::Nothing);
        }
        if let Some(hold) = active_hold {
            // Read right before the call: a call already made is not undone.
            return Err(snooze(
                HOLD_RECHECK,
                format!(
                    "creator {} has active hold {hold}: not sent until it is released",
                    payout.creator
                ),
            ));
        }
        let permitted = if R::RATE_LIMITED {
            self.limiter
                .take()
                .await
                .map_err(|e| HandlerError::Transient(e.to_string()))?
        } else {
            Ok(())
        };
        if let Err(wait) = permitted {
            return Err(snooze(wait, "waiting for the provider's limits"));
        }
        // The call carries the payout request's trace (its own span's, a
        // descendant, when traces are exported).
        let answer = self.answer(&payout, job.traceparent.as_deref()).await?;
        self.act_on(&payout, word::read(&payout, answer)).await
    }

    async fn complete(&self, tx: &mut PgConnection, done: &[(ClaimedJob, Delivered)]) -> Result<(), HandlerError> {
        for (job, delivered) in done {
            let id = payout_of(job)?;
            let applied = match delivered {
                Delivered::Word(word) => apply_word(tx, id, word, Source::Delivery, None).await,
                Delivered::Refused(why) => fail_refused(tx, id, &format!("refused by the provider: {why}"))
                    .await
                    .map(|_| super::Applied::Moved),
                Delivered::Nothing => Ok(super::Applied::Already),
            };
            applied.map_err(|e| HandlerError::Transient(format!("recording payout {id}'s delivery: {e:#}")))?;
        }
        Ok(())
    }
}

/// What the look-ups beside delivery look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polling {
    /// A payout the provider accepted this long ago (or last asked about
    /// that long ago) and still not paid or failed is looked up (its
    /// webhook lost).
    pub sent_after: Duration,
    /// A paid payout is looked up again this often (a return whose webhook
    /// was lost) ...
    pub paid_every: Duration,
    /// ... for this long after it was paid.
    pub returns_watch: Duration,
    /// How long the provider keeps a key: past it, a payout is looked up
    /// by its reference, not its key.
    pub key_window: Duration,
}

/// A payout due for a look-up.
#[derive(sqlx::FromRow)]
struct Due {
    #[sqlx(flatten)]
    payout: PayoutRow,
    /// How long ago its key was first used (None: not recorded).
    key_age_ms: Option<i64>,
}

const fn millis(d: Duration) -> i64 {
    let ms = d.as_millis();
    if ms > i64::MAX as u128 {
        i64::MAX
    } else {
        ms as i64
    }
}

/// Payouts due for a look-up (see [`Polling`]), up to `batch` of the sent
/// and `batch` of the paid, looked up on their rail and moved by its
/// answer (a paid one returned, say); the number looked up. A payout the
/// rail has no record of, or whose key is past the window and the rail
/// cannot say, is recorded as a conflict for operators.
pub async fn poll<R: Rail>(pool: &PgPool, rail: &R, polling: &Polling, batch: i64) -> anyhow::Result<usize> {
    let due: Vec<Due> = sqlx::query_as(&format!(
        "WITH due_sent AS (
             SELECT id FROM settlement.payouts
             WHERE status = 'sent' AND coalesce(polled_at, sent_at) < now() - $1 * interval '1 millisecond'
             ORDER BY coalesce(polled_at, sent_at) LIMIT $3
             FOR NO KEY UPDATE SKIP LOCKED),
         due_paid AS (
             SELECT id FROM settlement.payouts
             WHERE status = 'paid' AND coalesce(polled_at, finished_at) < now() - $2 * interval '1 millisecond'
               AND coalesce(polled_at, finished_at) > now() - $4 * interval '1 millisecond'
               AND finished_at > now() - $4 * interval '1 millisecond'
             ORDER BY coalesce(polled_at, finished_at) LIMIT $3
             FOR NO KEY UPDATE SKIP LOCKED)
         UPDATE settlement.payouts p SET polled_at = now()
         WHERE p.id IN (SELECT id FROM due_sent UNION ALL SELECT id FROM due_paid)
         RETURNING {},
                   (SELECT (extract(epoch FROM clock_timestamp() - k.first_used_at) * 1000)::bigint
                    FROM settlement.provider_keys k WHERE k.key = p.provider_key) AS key_age_ms",
        super::PAYOUT_COLUMNS
    ))
    .bind(millis(polling.sent_after)) // $1
    .bind(millis(polling.paid_every)) // $2
    .bind(batch) // $3
    .bind(millis(polling.returns_watch)) // $4
    .fetch_all(pool)
    .await?;
    let read_at = std::time::Instant::now();
    for Due { payout, key_age_ms } in &due {
        let key_use = match key_age_ms {
            Some(ms) => key_window::KeyUse {
                age: Duration::from_millis((*ms).max(0) as u64),
                read_at,
                awaiting_operator: None,
            },
            None => key_window::KeyUse::unknown(),
        };
        // Judged right before the look-up: a batch's look-ups take a while.
        let past = key_use.past(polling.key_window);
        let Some(payment) = look_up(pool, rail, payout, past).await? else {
            continue;
        };
        let mut tx = pool.begin().await?;
        if super::payment_matches(&mut tx, payout.id, &payment, Source::Poll, None).await? {
            apply_word(&mut tx, payout.id, &word::word_of(&payment), Source::Poll, None).await?;
        }
        tx.commit().await?;
    }
    Ok(due.len())
}

/// `payout`'s payment at the rail: by its key, or by its reference once the
/// key may be forgotten. None when there is none (recorded as a conflict),
/// or no answer now (asked again later).
async fn look_up<R: Rail>(
    pool: &PgPool,
    rail: &R,
    payout: &PayoutRow,
    key_past_window: bool,
) -> anyhow::Result<Option<Payment>> {
    let id = payout.id;
    let (found, missing) = if key_past_window {
        let found = key_window::judge(&payout.reference, rail.find(payout).await);
        (found, "the provider has no payment for this payout's reference")
    } else {
        let found = match rail.look_up(payout).await {
            Ok(Some(payment)) => Found::Payment(payment),
            Ok(None) => Found::Nothing,
            Err(err) => Found::Later(err),
        };
        (found, "the provider has no payment under this payout's key")
    };
    match found {
        Found::Payment(payment) => return Ok(Some(payment)),
        Found::Nothing => record_unknown(pool, payout, "missing", missing).await?,
        Found::CannotSay(detail) => record_unknown(pool, payout, "unknown", &detail).await?,
        Found::Later(err) => {
            tracing::warn!(payout = id, state = %payout.state, error = %err, "looking up a payout failed; asking again later")
        }
    }
    Ok(None)
}

/// A payout the provider does not know (`missing`), or cannot say it
/// knows (`unknown`): a conflict for operators, recorded once.
async fn record_unknown(pool: &PgPool, payout: &PayoutRow, provider_status: &str, detail: &str) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO settlement.payout_conflicts (payout_id, state, provider_status, source, detail)
         SELECT $1, $2, $3, 'poll', $4
         WHERE NOT EXISTS (SELECT 1 FROM settlement.payout_conflicts
                           WHERE payout_id = $1 AND provider_status = $3)",
    )
    .bind(payout.id) // $1
    .bind(payout.state.as_str()) // $2
    .bind(provider_status) // $3
    .bind(detail) // $4
    .execute(pool)
    .await?;
    tracing::warn!(
        payout = payout.id,
        state = %payout.state,
        detail,
        "the provider does not know a payout, or cannot say; recorded as a conflict"
    );
    Ok(())
}

/// How a process delivers payouts.
#[derive(Debug, Clone)]
pub struct DeliveryOptions {
    /// The provider's base URL.
    pub provider_url: String,
    /// A provider call's timeout.
    pub provider_timeout: Duration,
    /// The fleet's limits on calls.
    pub limits: Limits,
    /// The delivery queue's serving (loops, batch, leases, wake-up).
    pub serve: settled_engine::ServeConfig,
    /// What is looked up beside delivery.
    pub polling: Polling,
    /// How long the provider keeps a key.
    pub key_window: Duration,
    /// The chain to pay on instead of the provider (`settled deliver
    /// --chain-rpc-url`), connected.
    pub chain: Option<Arc<crate::chain::Chain>>,
}

/// Delivery's flags, the ones `settled deliver` and `settled worker` share
/// (flattened into both): how this process calls the provider and holds
/// its leases. The worker's leased settlement calls the provider and holds
/// its leases with them too.
#[derive(Debug, Clone, clap::Args)]
pub struct DeliveryFlags {
    /// Provider call timeout in milliseconds.
    #[arg(long, default_value_t = crate::provider::DEFAULT_PROVIDER_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub provider_timeout_ms: u64,
    /// Calls per second to the provider, over every process that calls it
    /// (`settled deliver`, and the payout delivery of `settled worker`'s
    /// daemon). Payouts paid on-chain are not counted: the node is called
    /// once per transaction.
    #[arg(long, env = "SETTLED_PROVIDER_RATE", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub provider_rate: u32,
    /// Provider calls in flight at once in this process, over all its claim
    /// loops (a claim's calls run concurrently), 1..=1024.
    #[arg(long, env = "SETTLED_PROVIDER_CONCURRENCY", default_value_t = settled_engine::raw::DEFAULT_CALLS_IN_FLIGHT as u32,
          value_parser = clap::value_parser!(u32).range(1..=settled_engine::raw::MAX_CALLS_IN_FLIGHT as i64))]
    pub provider_concurrency: u32,
    /// Lease time to live in milliseconds, renewed every ttl/3.
    #[arg(long, env = "SETTLED_LEASE_TTL_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(300..=3_600_000))]
    pub lease_ttl_ms: u64,
    /// How often expired leases are looked for, in milliseconds.
    #[arg(long, env = "SETTLED_RESCUE_INTERVAL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    pub rescue_interval_ms: u64,
    /// On SIGTERM/SIGINT, how long work in flight may finish before the rest
    /// is given back, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub shutdown_grace_ms: u64,
    /// How long the provider is known to keep an idempotency key (90s, 30m,
    /// 24h, 7d). Before any call under a key first used longer ago, settled
    /// looks the payment up by its reference and sends again only when the
    /// provider certainly has none; when it cannot say, the payout waits
    /// for an operator.
    #[arg(long, env = "SETTLED_PROVIDER_KEY_WINDOW", default_value = "24h", value_parser = key_window::parse_duration)]
    pub provider_key_window: Duration,
}

/// How delivery's queue is served: what only `settled deliver` sets by
/// flags. The payout delivery of `settled worker`'s daemon serves as
/// [`Serving::DAEMON`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    /// Claim loops.
    pub concurrency: u32,
    /// Payouts per claim.
    pub batch: u32,
    /// Calls that may go at once after a quiet spell (None: one second's worth).
    pub burst: Option<u32>,
    /// A payout accepted this long ago and still not paid or failed is looked up.
    pub poll_after: Duration,
    /// A paid payout is looked up again this often ...
    pub returns_poll_every: Duration,
    /// ... for this long after it was paid.
    pub returns_watch: Duration,
    /// Longest pause of an idle loop between two looks.
    pub max_poll: Duration,
}

/// How often a paid payout is looked up again for a return, by default.
pub const DEFAULT_RETURNS_POLL_EVERY: Duration = Duration::from_secs(24 * 3600);
/// How long after it was paid a payout is looked up for a return, by
/// default (banks return most within days, some weeks later).
pub const DEFAULT_RETURNS_WATCH: Duration = Duration::from_secs(30 * 24 * 3600);

impl Serving {
    /// The worker daemon's delivery, beside its settlement.
    pub const DAEMON: Serving = Serving {
        concurrency: 2,
        batch: 50,
        burst: None,
        poll_after: Duration::from_secs(300),
        returns_poll_every: DEFAULT_RETURNS_POLL_EVERY,
        returns_watch: DEFAULT_RETURNS_WATCH,
        max_poll: Duration::from_millis(1_000),
    };
}

/// Retries of one delivery: it is retried until the provider answers, and
/// its failures that are not the provider's word (a bug, a lost
/// connection) end as dead letters an operator replays, the payout still
/// queued.
pub const DELIVERY_ATTEMPTS_MAX: i32 = 25;

impl DeliveryFlags {
    /// The leases of this process's claims.
    pub fn leases(&self) -> settled_engine::LeaseConfig {
        settled_engine::LeaseConfig {
            ttl: Duration::from_millis(self.lease_ttl_ms),
            rescue_interval: Duration::from_millis(self.rescue_interval_ms),
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            calls_in_flight: self.provider_concurrency as usize,
        }
    }

    /// A provider call's timeout.
    pub fn provider_timeout(&self) -> Duration {
        Duration::from_millis(self.provider_timeout_ms)
    }

    /// Delivery through the provider at `provider_url`, its queue served as
    /// `serving` says; `wake` is how idle loops learn of new payouts.
    pub fn options(
        &self,
        provider_url: &str,
        serving: &Serving,
        wake: settled_engine::continuous::Wake,
    ) -> DeliveryOptions {
        let mut serve = settled_engine::ServeConfig {
            concurrency: serving.concurrency,
            batch: serving.batch,
            wake,
            poll: serving.max_poll,
            lease: self.leases(),
            ..settled_engine::ServeConfig::default()
        };
        serve.retry.max_attempts = DELIVERY_ATTEMPTS_MAX;
        DeliveryOptions {
            provider_url: provider_url.to_string(),
            provider_timeout: self.provider_timeout(),
            limits: Limits {
                per_second: f64::from(self.provider_rate),
                burst: f64::from(serving.burst.unwrap_or(self.provider_rate)),
                ..Limits::default()
            },
            serve,
            polling: Polling {
                sent_after: serving.poll_after,
                paid_every: serving.returns_poll_every,
                returns_watch: serving.returns_watch,
                key_window: self.provider_key_window,
            },
            key_window: self.provider_key_window,
            chain: None,
        }
    }
}

/// How often the housekeeping beside delivery runs (expiry, polling).
pub const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(5);
/// Payouts looked up or expired per housekeeping round.
pub const HOUSEKEEPING_BATCH: i64 = 200;

/// Delivers payouts until `stats.request_stop()`: the delivery queue served
/// in leased mode, with the expiry of unconfirmed payouts and the polling
/// of long-sent ones beside it.
pub async fn run_delivery(
    pool: &PgPool,
    opts: DeliveryOptions,
    stats: Arc<settled_engine::ServeStats>,
) -> anyhow::Result<()> {
    match opts.chain.clone() {
        Some(chain) => {
            let rail = crate::chain::ChainRail::new(chain.clone(), pool.clone());
            let watcher = tokio::spawn(crate::chain::watch::watch(
                pool.clone(),
                chain.clone(),
                chain.watch_every,
                chain.reconcile_every,
            ));
            let follower = tokio::spawn(crate::chain::confirm::follow(
                pool.clone(),
                chain,
                crate::chain::FOLLOW_EVERY,
            ));
            let served = serve_through(pool, rail, opts, stats).await;
            follower.abort();
            watcher.abort();
            served
        }
        None => {
            let provider = crate::provider::HttpProvider::new(&opts.provider_url, opts.provider_timeout)?;
            serve_through(pool, provider, opts, stats).await
        }
    }
}

/// Serves the delivery queue through `rail`, with the housekeeping beside it.
async fn serve_through<R: Rail + Clone>(
    pool: &PgPool,
    rail: R,
    opts: DeliveryOptions,
    stats: Arc<settled_engine::ServeStats>,
) -> anyhow::Result<()> {
    let limiter = Arc::new(Limiter::new(pool.clone(), opts.limits.clone()));
    let handler = Arc::new(Deliver::new(rail.clone(), pool.clone(), limiter).with_key_window(opts.key_window));
    let housekeeping = tokio::spawn(housekeeping(pool.clone(), rail, opts.polling));
    let served =
        settled_engine::serve_leased(pool, Arc::new(super::delivery_queue()), handler, opts.serve, stats).await;
    housekeeping.abort();
    Ok(served?)
}

/// Expires unconfirmed payouts and looks up long-sent and recently paid
/// ones, every [`HOUSEKEEPING_EVERY`], until aborted.
async fn housekeeping<R: Rail>(pool: PgPool, rail: R, polling: Polling) {
    let mut tick = tokio::time::interval(HOUSEKEEPING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let expired = async {
            let mut conn = pool.acquire().await?;
            super::expire_unconfirmed(&mut conn, HOUSEKEEPING_BATCH as i32).await
        }
        .await;
        match expired {
            Ok(0) => {}
            Ok(n) => tracing::info!(expired = n, "unconfirmed payouts expired; funds returned"),
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "expiring unconfirmed payouts failed"),
        }
        if let Err(err) = poll(&pool, &rail, &polling, HOUSEKEEPING_BATCH).await {
            tracing::warn!(error = %format!("{err:#}"), "looking up sent and paid payouts failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_answers_from_what_it_holds_and_asks_the_bucket_only_when_it_has_nothing() {
        let mut budget = Budget {
            calls: 2,
            ..Budget::default()
        };
        assert_eq!(budget.take(), Some(Ok(())));
        assert_eq!(budget.take(), Some(Ok(())));
        assert_eq!(budget.take(), None, "empty: ask the bucket");
        budget.empty_until = Some(Instant::now() + Duration::from_secs(5));
        assert!(
            matches!(budget.take(), Some(Err(wait)) if wait > Duration::from_secs(4)),
            "the bucket was empty: wait, without asking it again"
        );
        budget.calls = 3;
        budget.down_until = Some(Instant::now() + Duration::from_secs(9));
        assert!(
            matches!(budget.take(), Some(Err(wait)) if wait > Duration::from_secs(8)),
            "the provider is down: wait, keeping the calls"
        );
        assert_eq!(budget.calls, 3);
    }
}
