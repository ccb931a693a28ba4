//! Delivery: payouts leave the database exactly once. Leased workers serve
//! the delivery queue (one job per queued payout, committed with its
//! debit); each call to the provider carries the payout's provider key, the
//! same on every retry, after any crash, from any worker or failover, so
//! the provider applies it once; the provider's answer moves the payout in
//! the completion's transaction, which the lease's fence guards.
//!
//! The provider's limits hold for the whole fleet (`limiter.rs`). A job
//! that cannot call now, or whose creator is on hold, is
//! snoozed: it spends no attempt, and nothing spins. A refusal fails the
//! payout and returns its funds; a payment id another payout holds is a
//! conflict and a dead letter, never a completion that fails again.
//! Before a call under a key first used longer ago than the provider's
//! key window, the payment is found by its reference instead
//! (`key_window.rs`): sent again only when the provider certainly has
//! none. Beside the workers: payouts sent long ago, and those paid within
//! the returns watch, are looked up (`poll.rs`: a lost webhook, a return),
//! and unconfirmed ones expire.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use settled_engine::{ClaimedJob, HandlerError, LeasedJobHandler};

use super::key_window::{self, Found, DEFAULT_PROVIDER_KEY_WINDOW};
use super::limiter::{Limiter, Limits};
use super::poll::{poll, Polling};
use super::word::{self, Reading};
use super::{apply_words, fail_refused, record_payment_clash, PayoutRow, PayoutState, ProviderWord, Rail, Source};
use crate::provider::{Payment, ProviderError};

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
pub(crate) const HOLD_RECHECK: Duration = Duration::from_secs(5);

/// The delivery handler: sends each queued payout through its rail.
pub struct Deliver<R> {
    rail: R,
    pool: PgPool,
    limiter: Arc<Limiter>,
    key_window: Duration,
}

impl<R: Rail> Deliver<R> {
    /// A handler sending through `rail`, within the fleet's `limiter`,
    /// for a provider that keeps keys `DEFAULT_PROVIDER_KEY_WINDOW`.
    pub fn new(rail: R, pool: PgPool, limiter: Arc<Limiter>) -> Deliver<R> {
        Deliver {
            rail,
            pool,
            limiter,
            key_window: DEFAULT_PROVIDER_KEY_WINDOW,
        }
    }

    /// The same handler, for a provider that keeps keys `window`.
    pub(crate) fn with_key_window(self, window: Duration) -> Deliver<R> {
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
        // The provider's words in one statement, by payout id; refusals one by one.
        let mut words = Vec::new();
        for (job, delivered) in done {
            let id = payout_of(job)?;
            match delivered {
                Delivered::Word(word) => words.push((id, word.clone())),
                Delivered::Refused(why) => {
                    fail_refused(tx, id, &format!("refused by the provider: {why}"))
                        .await
                        .map_err(|e| HandlerError::Transient(format!("recording payout {id}'s refusal: {e:#}")))?;
                }
                Delivered::Nothing => {}
            }
        }
        words.sort_by_key(|(id, _)| *id);
        if !words.is_empty() {
            apply_words(tx, &words, Source::Delivery, None)
                .await
                .map_err(|e| HandlerError::Transient(format!("recording {} payouts' delivery: {e:#}", words.len())))?;
        }
        Ok(())
    }
}

/// How a process delivers payouts.
#[derive(Debug, Clone)]
pub(crate) struct DeliveryOptions {
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
pub(crate) struct Serving {
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
pub(crate) const DEFAULT_RETURNS_POLL_EVERY: Duration = Duration::from_secs(24 * 3600);
/// How long after it was paid a payout is looked up for a return, by
/// default (banks return most within days, some weeks later).
pub(crate) const DEFAULT_RETURNS_WATCH: Duration = Duration::from_secs(30 * 24 * 3600);

impl Serving {
    /// The worker daemon's delivery, beside its settlement.
    pub(crate) const DAEMON: Serving = Serving {
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
pub(crate) const DELIVERY_ATTEMPTS_MAX: i32 = 25;

impl DeliveryFlags {
    /// The leases of this process's claims.
    pub(crate) fn leases(&self) -> settled_engine::LeaseConfig {
        settled_engine::LeaseConfig {
            ttl: Duration::from_millis(self.lease_ttl_ms),
            rescue_interval: Duration::from_millis(self.rescue_interval_ms),
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            calls_in_flight: self.provider_concurrency as usize,
        }
    }

    /// A provider call's timeout.
    pub(crate) fn provider_timeout(&self) -> Duration {
        Duration::from_millis(self.provider_timeout_ms)
    }

    /// Delivery through the provider at `provider_url`, its queue served as
    /// `serving` says; `wake` is how idle loops learn of new payouts.
    pub(crate) fn options(
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
pub(crate) const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(5);
/// Payouts looked up or expired per housekeeping round.
pub(crate) const HOUSEKEEPING_BATCH: i64 = 200;

/// Delivers payouts until `stats.request_stop()`: the delivery queue served
/// in leased mode, with the expiry of unconfirmed payouts and the polling
/// of long-sent ones beside it.
pub(crate) async fn run_delivery(
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
