//! `settled deliver`: payouts leave the database exactly once.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::payouts::deliver::{DeliveryOptions, Limits};

/// Deliver queued payouts to the payment provider, until SIGTERM or SIGINT.
///
/// Serves the delivery queue (one job per queued payout, committed with its
/// debit) in leased mode: each call carries the payout's own provider key,
/// so a retry, a crash, a paused worker or a failover never pays twice; the
/// provider's answer moves the payout (sent, paid, failed with its funds
/// returned) under the lease's fence. Calls per second hold for the whole
/// fleet (in the database); while the provider is down every worker waits,
/// spending no attempts. Beside it: unconfirmed payouts expire, and payouts
/// sent long ago without a webhook are looked up. Start as many as you like.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The payment provider (e.g. http://127.0.0.1:9100).
    #[arg(long, env = "SETTLED_PROVIDER_URL")]
    pub provider_url: String,
    /// Provider call timeout in milliseconds.
    #[arg(long, default_value_t = crate::provider::DEFAULT_PROVIDER_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub provider_timeout_ms: u64,
    /// Calls per second to the provider, over every delivering process.
    #[arg(long, env = "SETTLED_PROVIDER_RATE", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub provider_rate: u32,
    /// Calls that may go at once after a quiet spell (default: one second's worth).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub provider_burst: Option<u32>,
    /// Claim loops in this process, 1..=256.
    #[arg(long, env = "SETTLED_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Payouts per claim, 1..=10000.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
    /// Provider calls in flight at once in this process, 1..=1024.
    #[arg(long, env = "SETTLED_PROVIDER_CONCURRENCY", default_value_t = settled_engine::raw::DEFAULT_CALLS_IN_FLIGHT as u32,
          value_parser = clap::value_parser!(u32).range(1..=settled_engine::raw::MAX_CALLS_IN_FLIGHT as i64))]
    pub provider_concurrency: u32,
    /// Lease time to live in milliseconds, renewed every ttl/3.
    #[arg(long, env = "SETTLED_LEASE_TTL_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(300..=3_600_000))]
    pub lease_ttl_ms: u64,
    /// How often expired leases are looked for, in milliseconds.
    #[arg(long, env = "SETTLED_RESCUE_INTERVAL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    pub rescue_interval_ms: u64,
    /// On SIGTERM/SIGINT, how long calls in flight may finish, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub shutdown_grace_ms: u64,
    /// A payout accepted by the provider this many seconds ago and still not
    /// paid or failed (its webhook lost) is looked up.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub poll_after_secs: u64,
    /// Longest pause of an idle loop between two looks, in milliseconds
    /// (it wakes at once on a new payout's notification).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub max_poll_ms: u64,
}

impl Args {
    /// What delivery does, from the flags; `wake` is how idle loops learn
    /// of new payouts.
    pub fn options(&self, wake: settled_engine::continuous::Wake) -> DeliveryOptions {
        let mut serve = settled_engine::ServeConfig {
            concurrency: self.concurrency,
            batch: self.batch,
            wake,
            poll: Duration::from_millis(self.max_poll_ms),
            lease: settled_engine::LeaseConfig {
                ttl: Duration::from_millis(self.lease_ttl_ms),
                rescue_interval: Duration::from_millis(self.rescue_interval_ms),
                shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
                calls_in_flight: self.provider_concurrency as usize,
            },
            ..settled_engine::ServeConfig::default()
        };
        // A delivery is retried until the provider answers: its failures
        // that are not the provider's word (a bug, a lost connection) end
        // as dead letters an operator replays, the payout still queued.
        serve.retry.max_attempts = 25;
        DeliveryOptions {
            provider_url: self.provider_url.clone(),
            provider_timeout: Duration::from_millis(self.provider_timeout_ms),
            limits: Limits {
                per_second: f64::from(self.provider_rate),
                burst: f64::from(self.provider_burst.unwrap_or(self.provider_rate)),
                ..Limits::default()
            },
            serve,
            poll_after: Duration::from_secs(self.poll_after_secs),
        }
    }
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_worker");
    const APPLICATION_NAME: &'static str = "settled-deliver";

    fn connections(&self) -> u32 {
        self.concurrency + 6
    }

    async fn run(self, db: &Database) -> Outcome {
        let wake = db.wake().await?;
        let stats = Arc::new(settled_engine::ServeStats::default());
        let stopper = stats.clone();
        let signals = tokio::spawn(async move {
            crate::worker::stop_signal().await;
            tracing::info!("signal received: finishing the calls in flight, claiming no more");
            stopper.request_stop();
        });
        let delivered = crate::payouts::deliver::run_delivery(&db.pool, self.options(wake), stats.clone()).await;
        signals.abort();
        delivered?;
        println!(
            "deliver stopped: {} payouts handled, {} snoozed, {} refused by the fence",
            stats.settled.load(std::sync::atomic::Ordering::Relaxed),
            stats.snoozed.load(std::sync::atomic::Ordering::Relaxed),
            stats.fence_rejections.load(std::sync::atomic::Ordering::Relaxed)
        );
        Ok(ExitCode::SUCCESS)
    }
}
