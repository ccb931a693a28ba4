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
//! Beside the workers: payouts sent long ago are looked up (a lost
//! webhook), and unconfirmed ones expire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use settled_engine::{ClaimedJob, HandlerError, LeasedJobHandler};

use super::{apply_word, fail_refused, record_payment_clash, PayoutState, ProviderWord, Source};
use crate::money::Amount;
use crate::provider::{Payment, PaymentStatus, PayoutProvider, ProviderError};

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

/// The provider's payment as the payout state machine's word.
pub fn word_of(payment: &Payment) -> ProviderWord {
    match payment.status {
        PaymentStatus::Pending => ProviderWord::Pending {
            provider_id: payment.id.clone(),
        },
        PaymentStatus::Paid => ProviderWord::Paid {
            provider_id: payment.id.clone(),
        },
        PaymentStatus::Failed => ProviderWord::Failed {
            provider_id: Some(payment.id.clone()),
            reason: payment
                .failure_reason
                .clone()
                .unwrap_or_else(|| "no reason given".into()),
        },
    }
}

/// A queued payout, as delivery reads it.
#[derive(sqlx::FromRow)]
struct ToDeliver {
    status: String,
    creator: String,
    amount: String,
    provider_key: String,
    /// What the provider shows as the payment's reference: part of the
    /// request under the key, so as lasting as the key (a withdrawal's
    /// provider key; the id for payouts keyed by their id).
    reference: String,
    /// The creator's active hold, if any: nothing is sent meanwhile.
    active_hold: Option<i64>,
}

/// How long a payout whose creator is on hold waits before delivery looks
/// at its hold again (a snooze: it spends no attempt).
pub const HOLD_RECHECK: Duration = Duration::from_secs(5);

/// The delivery handler: calls the provider for each queued payout.
pub struct Deliver<P> {
    provider: P,
    pool: PgPool,
    limiter: Arc<Limiter>,
}

impl<P: PayoutProvider> Deliver<P> {
    /// A handler calling `provider`, within the fleet's `limiter`.
    pub fn new(provider: P, pool: PgPool, limiter: Arc<Limiter>) -> Deliver<P> {
        Deliver {
            provider,
            pool,
            limiter,
        }
    }

    async fn load(&self, id: i64) -> Result<Option<ToDeliver>, HandlerError> {
        Ok(sqlx::query_as(
            "SELECT status, creator, amount::text AS amount, provider_key,
                    CASE WHEN kind = 'withdrawal' AND NOT provider_key_from_id THEN provider_key
                         ELSE id::text END AS reference,
                    (SELECT h.id FROM settlement.creator_holds h
                     WHERE h.creator = p.creator AND h.released_at IS NULL) AS active_hold
             FROM settlement.payouts p WHERE id = $1",
        )
        .bind(id) // $1
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A payment whose id another payout holds (a provider that restarted
    /// its ids, a bridge moved to another provider) cannot be recorded: it
    /// is a conflict for operators, and the job a dead letter that says so,
    /// rather than a completion that fails on every retry.
    async fn refuse_clash(&self, id: i64, payment: &Payment) -> Result<(), HandlerError> {
        let mut conn = self.pool.acquire().await?;
        let clash = record_payment_clash(&mut conn, id, &payment.id, payment.status.as_str(), Source::Delivery)
            .await
            .map_err(|e| HandlerError::Transient(format!("checking payout {id}'s payment id: {e:#}")))?;
        match clash {
            None => Ok(()),
            Some(clash) => Err(HandlerError::Permanent(format!(
                "payout {id}: {clash}; recorded as a conflict, the payout stays queued with its funds held"
            ))),
        }
    }
}

impl<P> Deliver<P> {
    /// Records in `settlement.payout_conflicts` that the provider answered
    /// payout `id`'s key with `payment`, which is not its payment.
    async fn record_conflict(&self, id: i64, payment: &Payment) -> Result<(), HandlerError> {
        let mut conn = self.pool.acquire().await?;
        super::payment_matches(&mut conn, id, payment, Source::Delivery, None)
            .await
            .map_err(|e| HandlerError::Transient(format!("recording payout {id}'s conflict: {e:#}")))?;
        Ok(())
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

impl<P: PayoutProvider + Clone> LeasedJobHandler for Deliver<P> {
    type Output = Delivered;

    async fn work(&self, job: &ClaimedJob) -> Result<Delivered, HandlerError> {
        let id = payout_of(job)?;
        let Some(payout) = self.load(id).await? else {
            return Err(HandlerError::Permanent(format!("payout {id} does not exist")));
        };
        if payout.status != PayoutState::Queued.as_str() {
            return Ok(Delivered::Nothing);
        }
        if let Some(hold) = payout.active_hold {
            // Read right before the call: a call already made is not undone.
            return Err(snooze(
                HOLD_RECHECK,
                format!(
                    "creator {} has active hold {hold}: not sent until it is released",
                    payout.creator
                ),
            ));
        }
        let amount = Amount::parse_decimal(&payout.amount)
            .map_err(|e| HandlerError::Permanent(format!("payout {id}'s amount {:?}: {e}", payout.amount)))?;
        match self
            .limiter
            .take()
            .await
            .map_err(|e| HandlerError::Transient(e.to_string()))?
        {
            Ok(()) => {}
            Err(wait) => return Err(snooze(wait, "waiting for the provider's limits")),
        }
        // The call carries the payout request's trace (its own span's, a
        // descendant, when traces are exported).
        let answer = self
            .provider
            .with_traceparent(job.traceparent.as_deref())
            .pay(&payout.provider_key, &payout.creator, amount, Some(&payout.reference))
            .await;
        match answer {
            Ok((payment, _created)) => {
                let differs = super::payment_differs(&payout.provider_key, &payout.amount, &payout.creator, &payment);
                if let Some(detail) = differs {
                    // The provider answered the payout's key with another
                    // payment (another key, creator or amount): nothing is
                    // applied, the payout stays queued with its funds held,
                    // the conflict is recorded, and the job is a dead letter
                    // for operators (reconcile names the payout).
                    self.record_conflict(id, &payment).await?;
                    return Err(HandlerError::Permanent(format!("payout {id}: {detail}")));
                }
                self.limiter
                    .up()
                    .await
                    .map_err(|e| HandlerError::Transient(e.to_string()))?;
                self.refuse_clash(id, &payment).await?;
                Ok(Delivered::Word(word_of(&payment)))
            }
            Err(ProviderError::RateLimited { retry_after }) => {
                Err(snooze(retry_after, "the provider is rate limiting"))
            }
            Err(ProviderError::Transient(e)) => {
                let wait = self
                    .limiter
                    .down()
                    .await
                    .map_err(|e| HandlerError::Transient(e.to_string()))?;
                Err(snooze(wait, format!("the provider is unavailable: {e}")))
            }
            Err(ProviderError::Refused(e)) => Ok(Delivered::Refused(e)),
            Err(ProviderError::KeyConflict(e)) => Err(HandlerError::Permanent(format!(
                "the provider has key {} for a different request: {e}",
                payout.provider_key
            ))),
        }
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

/// Payouts sent at least `after` ago (or last asked about that long ago),
/// up to `batch`, looked up at the provider and moved by its answer; the
/// number looked up. A payout the provider has no record of is recorded as
/// a conflict for operators.
pub async fn poll_sent<P: PayoutProvider>(
    pool: &PgPool,
    provider: &P,
    after: Duration,
    batch: i64,
) -> anyhow::Result<usize> {
    let due: Vec<(i64, String)> = sqlx::query_as(
        "WITH due AS (
             SELECT id FROM settlement.payouts
             WHERE status = 'sent' AND coalesce(polled_at, sent_at) < now() - $1 * interval '1 millisecond'
             ORDER BY coalesce(polled_at, sent_at) LIMIT $2
             FOR NO KEY UPDATE SKIP LOCKED)
         UPDATE settlement.payouts p SET polled_at = now() FROM due WHERE p.id = due.id
         RETURNING p.id, p.provider_key",
    )
    .bind(after.as_millis() as i64) // $1
    .bind(batch) // $2
    .fetch_all(pool)
    .await?;
    for (id, key) in &due {
        let payment = match provider.lookup(key).await {
            Ok(Some(payment)) => payment,
            Ok(None) => {
                record_missing(pool, *id).await?;
                continue;
            }
            Err(err) => {
                tracing::warn!(payout = id, error = %err, "looking up a sent payout failed; asking again later");
                continue;
            }
        };
        let mut tx = pool.begin().await?;
        if super::payment_matches(&mut tx, *id, &payment, Source::Poll, None).await? {
            apply_word(&mut tx, *id, &word_of(&payment), Source::Poll, None).await?;
        }
        tx.commit().await?;
    }
    Ok(due.len())
}

/// A sent payout the provider does not know: a conflict for operators.
async fn record_missing(pool: &PgPool, id: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO settlement.payout_conflicts (payout_id, state, provider_status, source, detail)
         SELECT $1, 'sent', 'missing', 'poll', 'the provider has no payment under this payout''s key'
         WHERE NOT EXISTS (SELECT 1 FROM settlement.payout_conflicts
                           WHERE payout_id = $1 AND provider_status = 'missing')",
    )
    .bind(id) // $1
    .execute(pool)
    .await?;
    tracing::warn!(
        payout = id,
        "a sent payout is unknown to the provider; recorded as a conflict"
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
    /// A payout accepted this long ago and still unconfirmed is looked up.
    pub poll_after: Duration,
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
    let provider = crate::provider::HttpProvider::new(&opts.provider_url, opts.provider_timeout)?;
    let limiter = Arc::new(Limiter::new(pool.clone(), opts.limits.clone()));
    let handler = Arc::new(Deliver::new(provider.clone(), pool.clone(), limiter));
    let housekeeping = tokio::spawn(housekeeping(pool.clone(), provider, opts.poll_after));
    let served =
        settled_engine::serve_leased(pool, Arc::new(super::delivery_queue()), handler, opts.serve, stats).await;
    housekeeping.abort();
    Ok(served?)
}

/// Expires unconfirmed payouts and looks up long-sent ones, every
/// [`HOUSEKEEPING_EVERY`], until aborted.
async fn housekeeping<P: PayoutProvider>(pool: PgPool, provider: P, poll_after: Duration) {
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
        if let Err(err) = poll_sent(&pool, &provider, poll_after, HOUSEKEEPING_BATCH).await {
            tracing::warn!(error = %format!("{err:#}"), "looking up sent payouts failed");
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
