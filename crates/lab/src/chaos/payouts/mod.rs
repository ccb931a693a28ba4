//! `settled chaos --payouts`: a payout storm under faults, then proof that
//! every payout was paid once or returned once.
//!
//! On a fresh database with settled balances: `--servers` `settled serve`
//! processes take payouts from `--clients` concurrent clients whose
//! idempotency keys repeat (a repeat often arrives while the first is in
//! progress), some waiting for a confirmation that two requests then race
//! (two confirmations, or a confirmation and a cancel) and some left to
//! expire. `--workers` `settled deliver` processes pay them through the
//! provider simulator, which fails a share of payments, refuses a share of
//! keys, returns a share of paid payments a moment later (their banks send
//! them back), forgets every key a few seconds after its first use (the
//! deliverers are told a shorter key window), and sends its webhooks
//! duplicated, held back and lost, to one server then the other. A seeded schedule SIGKILLs deliverers (a new one
//! takes the slot), SIGSTOPs them past their leases, terminates their
//! connections, restarts PostgreSQL once (when chaos runs it), and makes
//! the provider answer 503s, 429s, and late applies (applied, the answer
//! lost to the caller's timeout). Once the faults stopped and everything
//! drained (bounded), the checks in `checks.rs` run beside `verify`.

mod checks;
mod clients;
mod fleet;
mod run;
mod statements;
mod storm;

use std::time::Instant;

pub use checks::PayoutCounts;

use super::faults::{provider_fault, FaultKind};
use super::{ChaosDb, ChaosReport, MAX_CHAOS_SECONDS, MAX_CHAOS_WORKERS};
use crate::provider_sim::Faults;
use run::run;

/// Most concurrent clients.
pub const MAX_CHAOS_CLIENTS: u32 = 512;
/// Most `settled serve` processes.
pub const MAX_CHAOS_SERVERS: u32 = 8;
/// Most payout requests of one run.
pub const MAX_CHAOS_REQUESTS: u64 = 1_000_000;
/// How long the storm may take to drain after the schedule ends.
pub const PAYOUT_DRAIN_DEADLINE_SECS: u64 = 240;
/// How long a payout made with `confirm: true` waits (short, so some expire).
const CONFIRM_TTL_SECS: u64 = 4;
/// The secret the simulator signs webhooks with.
const WEBHOOK_SECRET: &str = "chaos-webhook-secret";
/// How long each provider fault lasts (they add up when they overlap).
const PROVIDER_FAULT_SECS: u64 = 5;
/// The period whose settlement gives the creators their balances.
const PERIOD: &str = "2026-11-28";

/// What a payout storm does.
#[derive(Debug, Clone)]
pub struct PayoutChaosOptions {
    /// Creators with balances to pay out from.
    pub creators: u64,
    /// Payout requests (distinct idempotency keys).
    pub requests: u64,
    /// Concurrent clients.
    pub clients: u32,
    /// `settled serve` processes.
    pub servers: u32,
    /// `settled deliver` processes.
    pub deliverers: u32,
    /// Length of the fault schedule, in seconds (the requests are spread
    /// over its first 70%).
    pub duration: u64,
    /// Seed of the schedule, the requests and the provider's choices.
    pub seed: u64,
    /// The deliverers' lease ttl in milliseconds.
    pub lease_ttl_ms: u64,
    /// An existing server to make a fresh database on (None: a private,
    /// throwaway server, which chaos restarts once).
    pub database_url: Option<String>,
}

impl PayoutChaosOptions {
    fn check(&self) -> anyhow::Result<()> {
        let within = |what: &str, n: u64, max: u64| {
            anyhow::ensure!((1..=max).contains(&n), "{what} must be 1..={max}, got {n}");
            Ok(())
        };
        within("--workers", u64::from(self.deliverers), u64::from(MAX_CHAOS_WORKERS))?;
        within("--clients", u64::from(self.clients), u64::from(MAX_CHAOS_CLIENTS))?;
        within("--servers", u64::from(self.servers), u64::from(MAX_CHAOS_SERVERS))?;
        within("--requests", self.requests, MAX_CHAOS_REQUESTS)?;
        within("--duration", self.duration, MAX_CHAOS_SECONDS)?;
        within("--creators", self.creators, settled::seed::MAX_SEED_CREATORS)
    }
}

/// How long after its first use the simulator forgets a key.
const PROVIDER_FORGETS_KEYS_MS: u64 = 6_000;
/// The key window the deliverers are told: shorter than the provider's.
const DELIVERERS_KEY_WINDOW: &str = "4s";
/// Time from a payment's paid to its return.
const RETURN_DELAY_MS: u64 = 300;

/// What the provider does all along: pays after a moment, fails a tenth,
/// refuses a twentieth of the keys, returns a tenth of the paid ones,
/// forgets keys after a few seconds; webhooks duplicated, held back, lost.
fn provider_base() -> Faults {
    Faults {
        settle_delay_ms: 200,
        failure_rate: 0.1,
        refusal_rate: 0.05,
        return_rate: 0.1,
        return_delay_ms: RETURN_DELAY_MS,
        forget_keys_after_ms: PROVIDER_FORGETS_KEYS_MS,
        webhook_duplicate_rate: 0.2,
        webhook_reorder_rate: 0.2,
        webhook_reorder_max_ms: 1_000,
        webhook_loss_rate: 0.15,
        webhook_retry_max_ms: 2_000,
        webhook_attempts_max: 60,
        ..Faults::default()
    }
}

/// The provider's behaviour with `active` faults on top of its base.
fn provider_now(active: &[(FaultKind, Instant)]) -> Faults {
    active
        .iter()
        .fold(provider_base(), |faults, (kind, _)| provider_fault(*kind, faults).0)
}

/// Runs a payout storm and returns its report.
pub async fn chaos_payouts(opts: PayoutChaosOptions) -> anyhow::Result<ChaosReport> {
    opts.check()?;
    let scratch = tempfile::Builder::new().prefix("settled-chaos-").tempdir()?;
    let place = ChaosDb::create(&opts.database_url, scratch.path()).await?;
    let result = run(&opts, &place.url, place.server.as_ref(), scratch.path()).await;
    place.finish(result, scratch).await
}
