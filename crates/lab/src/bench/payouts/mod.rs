//! `settled bench --payouts`: payouts end to end on one fresh database,
//! with real `settled deliver` and `settled serve` processes and the
//! provider simulator answering after `--provider-latency-ms`.
//!
//! 1. Delivery throughput: a backlog of payouts committed in one
//!    transaction (its commit wakes the deliverers); the clock runs from
//!    the commit to the last payout leaving `queued` (each called at the
//!    provider and its answer recorded). Repeated `--payout-runs` times.
//! 2. Wake-up latency on an idle system: payouts made one at a time
//!    through `settled serve`, each pause long enough for the system to go
//!    idle; per payout, the time from its 201 (as the client saw it) to
//!    the arrival of its provider call (as the simulator saw it, on the
//!    same clock).
//! 3. Payouts through `settled serve` with delivery running: clients make
//!    payouts as fast as the servers answer for `--serve-seconds`; 201s
//!    per second, and what delivery moved meanwhile.

mod fleet;
mod measure;
mod procs;
mod report;
mod runs;
mod stats;

pub(super) use procs::{met, next_payout_id, settled_balances, wait_listening, wait_ready};
pub use report::{PayoutBenchReport, ServeRun, ThroughputRun, Wakeup};
pub(super) use stats::{load_average, percentile, unix_us};

use measure::measure;

/// Most deliverers or servers one bench starts.
pub const MAX_PAYOUT_PROCESSES: u32 = 16;
/// Largest backlog of one throughput run.
pub const MAX_BACKLOG: u64 = 1_000_000;
/// Creators the payouts are spread over (each with a settled balance).
const CREATORS: u64 = 1_000;
/// The API token of the bench's servers.
const API_TOKEN: &str = "bench-token";
/// Pause between two payouts of the latency measurement: the system goes
/// idle (every loop asleep on LISTEN) in between.
const IDLE_PAUSE_MS: u64 = 60;
/// A backlog not drained within this many seconds per thousand payouts
/// (and a minute) fails the bench.
const DRAIN_SECS_PER_THOUSAND: u64 = 10;
/// Throughput target, payouts per second (issue 26).
pub const TARGET_DELIVERED_PER_SEC: f64 = 2_000.0;
/// Wake-up target: p99 from the 201 to the provider call, in ms.
pub const TARGET_WAKEUP_P99_MS: f64 = 50.0;

/// What `settled bench --payouts` measures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PayoutBenchOptions {
    /// `settled deliver` processes.
    pub deliverers: u32,
    /// The simulator's latency on every call, ms.
    pub provider_latency_ms: u64,
    /// `settled deliver --concurrency`.
    pub concurrency: u32,
    /// `settled deliver --batch`.
    pub batch: u32,
    /// `settled deliver --provider-concurrency`.
    pub provider_concurrency: u32,
    /// Payouts per throughput run.
    pub backlog: u64,
    /// Throughput runs and serve runs (the report quotes medians).
    pub runs: u32,
    /// Payouts of the latency measurement.
    pub latency_samples: u32,
    /// `settled serve` processes of the serve measurement.
    pub servers: u32,
    /// Concurrent clients of the serve measurement.
    pub clients: u32,
    /// Seconds of each serve run.
    pub serve_seconds: u64,
    /// The server (None: a private one started for the bench).
    #[serde(skip)]
    pub database_url: Option<String>,
    /// The command line.
    pub command: String,
}

fn check(opts: &PayoutBenchOptions) -> anyhow::Result<()> {
    for (flag, n) in [("--deliverers", opts.deliverers), ("--servers", opts.servers)] {
        anyhow::ensure!(
            (1..=MAX_PAYOUT_PROCESSES).contains(&n),
            "{flag} must be 1..={MAX_PAYOUT_PROCESSES}"
        );
    }
    anyhow::ensure!(
        (1..=MAX_BACKLOG).contains(&opts.backlog),
        "--backlog must be 1..={MAX_BACKLOG}"
    );
    anyhow::ensure!(opts.runs >= 1, "--payout-runs must be at least 1");
    anyhow::ensure!(opts.latency_samples >= 1, "--latency-samples must be at least 1");
    anyhow::ensure!(opts.clients >= 1, "--serve-clients must be at least 1");
    Ok(())
}

/// Runs the payout bench on a fresh database.
pub async fn payouts(opts: &PayoutBenchOptions) -> anyhow::Result<PayoutBenchReport> {
    check(opts)?;
    super::on_fresh_database(&opts.database_url, |url, scratch| async move {
        measure(opts, &url, &scratch).await
    })
    .await
}
