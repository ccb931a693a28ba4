//! `settled bench`.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use settled::cmd::{exit_code, Global, Outcome, Runnable};

use crate::bench::continuous::ContinuousOptions;
use crate::bench::{BenchOptions, Strategy, DEFAULT_PEERS};

/// Measure claiming strategies, the SQL floors and peer job queues.
///
/// Each case settles the same seeded period on a fresh database (on
/// DATABASE_URL's server, or on a private throwaway server, fsync on,
/// started in a temporary directory for the run; --data-dir is not used) with W
/// `settled bench-worker` processes, started and connected before the
/// clock starts. Records creators/s, scaling efficiency, claim latency
/// p50/p99, sessions waiting on locks (sampled from pg_stat_activity),
/// transactions per item and verify's result (a case that fails verify is
/// reported as failed). Floors: the product's own statements under pgbench,
/// and one set-based transaction. Peers: the scripts under --peers-dir.
/// Prints a markdown table; --out DIR also writes results.json, results.md
/// and SVG/PNG plots. Exit 1 if any case failed.
///
/// With --continuous: job queues on their own workload instead (settled in
/// both modes and the peers' `continuous` scripts, 1 ms of work and one
/// effect row per job, a fixed-rate and a saturating producer, W jobs in
/// flight; completed jobs/s, pickup latency p50/p99, peak dead tuples,
/// duplicates; see docs/benchmarks.md).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Measure continuous job queues (settled's engine in both modes and
    /// the peers), each case a fresh database: --workers [default:
    /// 1,4,16,64], --peers, --seconds, --rate, --runs, --json FILE.
    #[arg(long, conflicts_with_all = ["days", "held_xmin", "pairs", "replot"])]
    continuous: bool,
    /// Measure payouts instead (one fresh database, the provider simulator
    /// answering after --provider-latency-ms): delivery throughput of
    /// --deliverers `settled deliver` processes on a committed backlog, the
    /// p99 from a payout's 201 to its provider call on an idle system, and
    /// payouts/s through `settled serve` with delivery running.
    #[arg(long, conflicts_with_all = ["continuous", "days", "held_xmin", "pairs", "replot"])]
    payouts: bool,
    /// --payouts: pay on-chain instead, on an anvil the bench starts
    /// (--block-time 1): payouts/s at saturation unbatched and batched, gas
    /// per payout next to a plain ERC-20 transfer's, block fill, and p99
    /// from a payout's 201 to its transaction's broadcast on an idle system.
    #[arg(long, requires = "payouts")]
    chain: bool,
    /// --payouts --chain: payouts per transaction of the batched run
    /// (`settled deliver --batch-max`).
    #[arg(long, default_value_t = settled::chain::DEFAULT_BATCH_MAX, requires = "chain",
          value_parser = clap::value_parser!(u32).range(2..=1_000))]
    batch_max: u32,
    /// --payouts: `settled deliver` processes.
    #[arg(long, default_value_t = 4, requires = "payouts")]
    deliverers: u32,
    /// --payouts: the provider's latency on every call, ms.
    #[arg(long, default_value_t = 50, requires = "payouts")]
    provider_latency_ms: u64,
    /// --payouts: each deliverer's --concurrency (claim loops).
    #[arg(long, default_value_t = 4, requires = "payouts")]
    deliver_concurrency: u32,
    /// --payouts: each deliverer's --batch (payouts per claim).
    #[arg(long, default_value_t = 200, requires = "payouts")]
    deliver_batch: u32,
    /// --payouts: each deliverer's --provider-concurrency (calls in flight).
    #[arg(long, default_value_t = 512, requires = "payouts")]
    deliver_calls: u32,
    /// --payouts: payouts per delivery run.
    #[arg(long, default_value_t = 20_000, requires = "payouts")]
    backlog: u64,
    /// --payouts: delivery runs and serve runs (the report quotes medians).
    #[arg(long, default_value_t = 3, requires = "payouts")]
    payout_runs: u32,
    /// --payouts: payouts of the idle wake-up measurement.
    #[arg(long, default_value_t = 300, requires = "payouts")]
    latency_samples: u32,
    /// --payouts: `settled serve` processes of the serve runs.
    #[arg(long, default_value_t = 2, requires = "payouts")]
    servers: u32,
    /// --payouts: concurrent clients of the serve runs.
    #[arg(long, default_value_t = 32, requires = "payouts")]
    serve_clients: u32,
    /// --payouts: seconds of each serve run.
    #[arg(long, default_value_t = 10, requires = "payouts")]
    serve_seconds: u64,
    /// --continuous: seconds each case's producer runs (the first fifth, at
    /// most 2 s, is a warm-up not counted).
    #[arg(long, default_value_t = 10, requires = "continuous", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    seconds: u64,
    /// --continuous: the fixed-rate producer's offered rate, jobs/s.
    #[arg(long, default_value_t = 500, requires = "continuous", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    rate: u64,
    /// --continuous: producers, comma separated (fixed, saturation).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![crate::bench::continuous::Producer::Fixed, crate::bench::continuous::Producer::Saturation], requires = "continuous")]
    producers: Vec<crate::bench::continuous::Producer>,
    /// --continuous: settled's modes, comma separated (tx, leased).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![crate::bench::continuous::ServeMode::Tx, crate::bench::continuous::ServeMode::Leased], requires = "continuous")]
    settled_modes: Vec<crate::bench::continuous::ServeMode>,
    /// --continuous: measure nothing; read earlier --continuous reports
    /// (comma separated: a later file's cases replace the earlier files'
    /// cases of the same system), judge the targets again, print the tables.
    #[arg(long, value_delimiter = ',', value_name = "JSON", requires = "continuous")]
    from_json: Option<Vec<PathBuf>>,
    /// --continuous: measure the peers only (to repeat a peer's cases).
    #[arg(long, requires = "continuous", conflicts_with = "settled_modes")]
    no_settled: bool,
    /// --continuous: repeats of the whole matrix (the report quotes medians).
    #[arg(long, default_value_t = 1, requires = "continuous", value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// --continuous: settled's jobs per claim.
    #[arg(long, default_value_t = 10, requires = "continuous", value_parser = clap::value_parser!(u32).range(1..=10000))]
    batch: u32,
    /// --continuous: the saturating producer keeps this many jobs waiting.
    #[arg(long, default_value_t = 2000, requires = "continuous", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    depth: u64,
    /// --continuous: seconds settled keeps finished jobs before its
    /// retention removes them.
    #[arg(long, default_value_t = 60, requires = "continuous", value_parser = clap::value_parser!(u64).range(1..))]
    retention_secs: u64,
    /// Small and fast, for CI smoke runs: 5,000 creators (400 with work),
    /// workers 1,4, no peers unless --peers is given.
    #[arg(long)]
    quick: bool,
    /// Creators per case without simulated work [default: 50000; quick: 5000].
    #[arg(long)]
    creators: Option<u64>,
    /// Creators per case with simulated work [default: 3000; quick: 400].
    #[arg(long)]
    work_creators: Option<u64>,
    /// Worker counts, comma separated [default: 1,2,4,8,16; quick: 1,4].
    #[arg(long, value_delimiter = ',')]
    workers: Option<Vec<u32>>,
    /// Simulated per-item work in ms, one set of cases per value.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0u64, 5])]
    work_ms: Vec<u64>,
    /// Strategies, comma separated [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    strategies: Option<Vec<Strategy>>,
    /// Items per claim without simulated work.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10000))]
    chunk: u32,
    /// Claim loops per worker process (`settled worker --concurrency`) in
    /// the strategy cases and the rounds of --pairs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    concurrency: u32,
    /// Items per claim with simulated work (small, so every worker gets some).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10000))]
    work_chunk: u32,
    /// Redis for the redis-lock strategy (skipped when none answers).
    #[arg(long, env = "SETTLED_BENCH_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Peer job queues to measure, comma separated, or `none`
    /// [default: graphile-worker,pg-boss,pgqueuer,apalis,awa; quick: none].
    #[arg(long, value_delimiter = ',')]
    peers: Option<Vec<String>>,
    /// Directory of the peer scripts.
    #[arg(long, default_value = "bench/peers")]
    peers_dir: PathBuf,
    /// Seconds a peer case may run; a peer still busy then is reported
    /// with the rate of what it settled (marked partial).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    peer_time_limit: u64,
    /// Skip the pgbench and set-based floors.
    #[arg(long)]
    no_floors: bool,
    /// Claim loops of the one worker process whose peak memory is measured (0: skip).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(0..=256))]
    memory_concurrency: u32,
    /// The soak instead of the cases: this many consecutive daily periods of
    /// --creators creators on one database, settled by the first --workers
    /// count of processes (default 4) with --chunk; per day throughput,
    /// claim latency, table sizes, dead tuples and autovacuum runs.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3650), conflicts_with = "held_xmin")]
    days: Option<u32>,
    /// The soak's retention: after each day, periods older than this many
    /// days are archived (settled archive --drop-ledger); 0 keeps them all.
    #[arg(long, default_value_t = 7, requires = "days")]
    retain_days: u32,
    /// The held-snapshot pair instead of the cases: --creators settled twice
    /// on fresh databases, without and with an idle-in-transaction session
    /// holding a REPEATABLE READ snapshot through the run.
    #[arg(long, conflicts_with = "pairs")]
    held_xmin: bool,
    /// Same-run pairs instead of the cases: this many rounds, each settling
    /// --creators with skip-locked-chunk (the first --workers count of
    /// processes, --concurrency loops each, --chunk), with one set-based
    /// transaction and with the product's statement under pgbench on
    /// disjoint key ranges, back to back, the order rotating, every case
    /// copied from the same vacuumed template; prints each round's ratio,
    /// the median and the spread (min to max).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100), conflicts_with = "days")]
    pairs: Option<u32>,
    /// The soak: set settlement.creator_balance's fillfactor to this before
    /// day 1 (to compare with the migrations' setting).
    #[arg(long, requires = "days", value_parser = clap::value_parser!(u32).range(10..=100))]
    balance_fillfactor: Option<u32>,
    /// Write results.json, results.md and plots (SVG, PNG) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the report as JSON instead of markdown; with a FILE, write
    /// the JSON there and print the markdown.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    json: Option<Option<PathBuf>>,
    /// Measure nothing: redraw results.md and the plots into --out from
    /// an earlier run's results.json.
    #[arg(long, value_name = "RESULTS_JSON", requires = "out")]
    replot: Option<PathBuf>,
}

impl Args {
    fn payout_options(&self, global: &Global) -> crate::bench::payouts::PayoutBenchOptions {
        crate::bench::payouts::PayoutBenchOptions {
            deliverers: self.deliverers,
            provider_latency_ms: self.provider_latency_ms,
            concurrency: self.deliver_concurrency,
            batch: self.deliver_batch,
            provider_concurrency: self.deliver_calls,
            backlog: self.backlog,
            runs: self.payout_runs,
            latency_samples: self.latency_samples,
            servers: self.servers,
            clients: self.serve_clients,
            serve_seconds: self.serve_seconds,
            database_url: global.database_url(),
            command: command_line(),
        }
    }

    fn chain_options(&self, global: &Global) -> crate::bench::chain::ChainBenchOptions {
        crate::bench::chain::ChainBenchOptions {
            deliverers: self.deliverers,
            concurrency: self.deliver_concurrency,
            batch: self.deliver_batch,
            batch_max: self.batch_max,
            backlog: self.backlog,
            latency_samples: self.latency_samples,
            database_url: global.database_url(),
            command: command_line(),
        }
    }

    fn continuous_options(&self, global: &Global) -> ContinuousOptions {
        ContinuousOptions {
            settled_modes: if self.no_settled {
                Vec::new()
            } else {
                self.settled_modes.clone()
            },
            peers: match &self.peers {
                Some(list) if list.iter().any(|p| p == "none") => Vec::new(),
                Some(list) => list.clone(),
                None => DEFAULT_PEERS.iter().map(|p| p.to_string()).collect(),
            },
            peers_dir: self.peers_dir.clone(),
            workers: self.workers.clone().unwrap_or_else(|| vec![1, 4, 16, 64]),
            producers: self.producers.clone(),
            rate: self.rate,
            seconds: self.seconds,
            runs: self.runs,
            batch: self.batch,
            depth: self.depth,
            retention_secs: self.retention_secs,
            work_ms: 1,
            database_url: global.database_url(),
            command: command_line(),
        }
    }

    fn options(self, global: &Global) -> BenchOptions {
        let quick = self.quick;
        let peers = match self.peers {
            Some(list) if list.iter().any(|p| p == "none") => Vec::new(),
            Some(list) => list,
            None if quick => Vec::new(),
            None => DEFAULT_PEERS.iter().map(|p| p.to_string()).collect(),
        };
        BenchOptions {
            creators: self.creators.unwrap_or(if quick { 5_000 } else { 50_000 }),
            work_creators: self.work_creators.unwrap_or(if quick { 400 } else { 3_000 }),
            workers: self
                .workers
                .unwrap_or_else(|| if quick { vec![1, 4] } else { vec![1, 2, 4, 8, 16] }),
            work_ms: self.work_ms,
            strategies: self.strategies.unwrap_or_else(|| Strategy::ALL.to_vec()),
            chunk: self.chunk,
            concurrency: self.concurrency,
            work_chunk: self.work_chunk,
            redis_url: self.redis_url,
            peers,
            peers_dir: self.peers_dir,
            peer_time_limit: self.peer_time_limit,
            floors: !self.no_floors,
            memory_concurrency: self.memory_concurrency,
            days: self.days,
            retain_days: self.retain_days,
            held_xmin: self.held_xmin,
            pairs: self.pairs,
            balance_fillfactor: self.balance_fillfactor,
            out: self.out,
            database_url: global.database_url(),
            command: command_line(),
        }
    }
}

/// This command line, for the report.
fn command_line() -> String {
    std::iter::once("settled".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints the report: JSON to stdout (--json), or JSON to a file
/// (--json FILE) and markdown to stdout, or markdown alone.
fn print<T: serde::Serialize>(
    report: &T,
    json: &Option<Option<PathBuf>>,
    markdown: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match json {
        Some(None) => println!("{}", serde_json::to_string_pretty(report)?),
        Some(Some(file)) => {
            std::fs::write(file, serde_json::to_string_pretty(report)?)
                .with_context(|| format!("writing {}", file.display()))?;
            eprintln!("bench: wrote {}", file.display());
            print!("{}", markdown());
        }
        None => print!("{}", markdown()),
    }
    Ok(())
}

impl Runnable for Args {
    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            if let (Some(results), Some(out)) = (&self.replot, &self.out) {
                let report = crate::bench::replot(results, out)?;
                eprintln!(
                    "bench: redrew results.md and plots in {} from {}",
                    out.display(),
                    results.display()
                );
                if self.json.is_some() {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let json = self.json.clone();
            if self.chain {
                let report = crate::bench::chain::chain_payouts(&self.chain_options(&global)).await?;
                print(&report, &json, || report.markdown())?;
                return Ok(exit_code(report.ok()));
            }
            if self.payouts {
                let report = crate::bench::payouts::payouts(&self.payout_options(&global)).await?;
                print(&report, &json, || report.markdown())?;
                return Ok(exit_code(report.ok()));
            }
            if self.continuous {
                let report = match &self.from_json {
                    Some(files) => crate::bench::continuous::ContinuousReport::merge(files)?,
                    None => crate::bench::continuous::continuous(&self.continuous_options(&global)).await?,
                };
                print(&report, &json, || crate::bench::continuous::markdown(&report))?;
                return Ok(exit_code(report.ok()));
            }
            if self.days.is_some() || self.held_xmin || self.pairs.is_some() {
                let opts = self.options(&global);
                let report = crate::bench::long_life(&opts).await?;
                print(&report, &json, || report.markdown(&opts))?;
                return Ok(ExitCode::SUCCESS);
            }
            let report = crate::bench::bench(&self.options(&global)).await?;
            print(&report, &json, || crate::bench::markdown(&report))?;
            Ok(exit_code(report.cases.iter().all(|c| c.ok())))
        })
    }
}
