//! `settled deliver`: payouts leave the database exactly once.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::chain::{Chain, ChainFlags};
use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::payouts::deliver::{DeliveryFlags, DeliveryOptions, Serving};
use crate::payouts::key_window::parse_duration;

/// Deliver queued payouts to the payment provider, or on-chain, until
/// SIGTERM or SIGINT.
///
/// With --chain-rpc-url, each payout is an ERC-20 transfer from the hot
/// wallet (--signer-key-file) to its creator: signed and stored before it
/// is broadcast, sent again with the same bytes after any doubt, paid when
/// its block is --confirmations deep, failed (funds returned) if it
/// reverted; a reorg sends it again.
///
/// Serves the delivery queue (one job per queued payout, committed with its
/// debit) in leased mode: each call carries the payout's own provider key,
/// so a retry, a crash, a paused worker or a failover never pays twice; the
/// provider's answer moves the payout (sent, paid, failed with its funds
/// returned) under the lease's fence. Calls per second hold for the whole
/// fleet (in the database); while the provider is down every worker waits,
/// spending no attempts. Beside it: unconfirmed payouts expire, payouts
/// sent long ago without a webhook are looked up, and paid ones are looked
/// up again for a while (a return whose webhook was lost). Past the
/// provider's key window a payment is found by its reference before
/// anything is sent again. Start as many as you like.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The payment provider (e.g. http://127.0.0.1:9100); or pay on-chain
    /// with --chain-rpc-url.
    #[arg(
        long,
        env = "SETTLED_PROVIDER_URL",
        required_unless_present = "chain_rpc_url",
        conflicts_with = "chain_rpc_url"
    )]
    pub provider_url: Option<String>,
    /// Calls that may go at once after a quiet spell (default: one second's worth).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub provider_burst: Option<u32>,
    /// Claim loops in this process, 1..=256.
    #[arg(long, env = "SETTLED_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Payouts per claim, 1..=10000.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
    /// A payout accepted by the provider this many seconds ago and still not
    /// paid or failed (its webhook lost) is looked up.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub poll_after_secs: u64,
    /// A paid payout is looked up again this often (90s, 30m, 24h, 7d),
    /// for a return whose webhook was lost ...
    #[arg(long, env = "SETTLED_RETURNS_POLL_EVERY", default_value = "24h", value_parser = parse_duration)]
    pub returns_poll_every: Duration,
    /// ... for this long after it was paid.
    #[arg(long, env = "SETTLED_RETURNS_WATCH", default_value = "30d", value_parser = parse_duration)]
    pub returns_watch: Duration,
    /// Longest pause of an idle loop between two looks, in milliseconds
    /// (it wakes at once on a new payout's notification).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub max_poll_ms: u64,
    /// How this process calls the provider and holds its leases.
    #[command(flatten)]
    pub delivery: DeliveryFlags,
    /// The chain to pay on instead of the provider.
    #[command(flatten)]
    pub chain: ChainFlags,
}

impl Args {
    /// How the delivery queue is served, from the flags.
    pub(crate) fn serving(&self) -> Serving {
        Serving {
            concurrency: self.concurrency,
            batch: self.batch,
            burst: self.provider_burst,
            poll_after: Duration::from_secs(self.poll_after_secs),
            returns_poll_every: self.returns_poll_every,
            returns_watch: self.returns_watch,
            max_poll: Duration::from_millis(self.max_poll_ms),
        }
    }

    /// What delivery does, from the flags; `wake` is how idle loops learn
    /// of new payouts.
    pub(crate) fn options(&self, wake: settled_engine::continuous::Wake) -> DeliveryOptions {
        let provider_url = self.provider_url.as_deref().unwrap_or_default();
        self.delivery.options(provider_url, &self.serving(), wake)
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
        let mut options = self.options(wake);
        if let Some(chain) = Chain::connect(&db.pool, &self.chain).await? {
            println!(
                "deliver: paying on chain {} from {} (token {}, {} confirmations)",
                chain.chain_id,
                chain.wallet.address(),
                chain.token,
                chain.confirmations
            );
            options.chain = Some(Arc::new(chain));
        }
        let delivered = crate::payouts::deliver::run_delivery(&db.pool, options, stats.clone()).await;
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
