//! Command-line interface. Exit codes: 0 success; 1 the command ran and found
//! a problem (verification failed, a worker failed, bad input); 2 it could
//! not start (bad usage, no database and no PostgreSQL server binaries).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::db::{Database, DbOptions};
use crate::money::FeeBps;
use crate::period::Period;
use crate::progress::Progress;
use crate::settlement::DEFAULT_FEE_BPS;
use crate::worker::{Mode, WorkerOptions, WorkerOutcome};
use crate::{demo, seed, settlement, status, verify, worker};

/// Default claim loops per worker process.
pub const DEFAULT_CONCURRENCY: u32 = 4;
/// Default items per claim.
pub const DEFAULT_CHUNK: u32 = 100;

/// Settle creators' rewards exactly once, on any number of servers.
///
/// Workers split a period's creators with `SELECT ... FOR NO KEY UPDATE SKIP
/// LOCKED`; the database (row locks, conditional updates, unique keys) makes
/// sure nobody is paid twice. With DATABASE_URL unset, a private PostgreSQL is
/// started from the installed server binaries in --data-dir.
///
/// Exit codes: 0 success; 1 the command ran and found a problem; 2 it could not
/// start (bad usage, or no database and no PostgreSQL binaries).
#[derive(Debug, Parser)]
#[command(name = "settled", version, propagate_version = true)]
pub struct Cli {
    /// PostgreSQL URL. Unset: start a private server in --data-dir.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// Data directory of the private PostgreSQL (used when DATABASE_URL is unset).
    #[arg(long, env = "SETTLED_DATA_DIR", default_value = ".settled", global = true)]
    pub data_dir: PathBuf,

    /// Connect with the least-privilege role each command needs (SET ROLE
    /// settled_worker / settled_api / settled_readonly); the login role must be
    /// a member. Commands that change input or schema keep the login role.
    #[arg(long, env = "SETTLED_ROLE_PER_COMMAND", global = true)]
    pub role_per_command: bool,

    /// Log format on stderr: human, or json (one object per line).
    #[arg(long, env = "SETTLED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// The least role a command needs.
fn least_role(command: &Command) -> Option<&'static str> {
    match command {
        Command::Worker { .. } | Command::Run { .. } => Some("settled_worker"),
        Command::Serve { .. } => Some("settled_api"),
        Command::Status { .. } | Command::Verify { .. } | Command::Runs { .. } | Command::Workers { .. } => {
            Some("settled_readonly")
        }
        _ => None,
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database migrations (every other command also does this when needed).
    Migrate,
    /// Create deterministic synthetic trade volumes for a period.
    ///
    /// Creators get valid EVM addresses (the same creators for the same seed in
    /// every period); volumes are skewed, with some zeros and a few near 2^256.
    /// Refused once the period has a run. Re-running with the same arguments
    /// adds nothing.
    Seed {
        /// The period (YYYY-MM-DD).
        #[arg(long)]
        period: Period,
        /// How many creators.
        #[arg(long)]
        creators: u64,
        /// Seed of the generator.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also set the period's fee (basis points, 0..=10000). Without it, a
        /// period with no policy gets the default of 250.
        #[arg(long)]
        fee_bps: Option<u32>,
    },
    /// Import trade volumes from a CSV or JSON Lines file (or `-` for stdin).
    ///
    /// CSV: a header `period,creator,volume` (or `creator,volume` with
    /// --period) and one row per line. JSONL: one object per line with
    /// `period`, `creator`, `volume` (volume as a string of digits). Every line
    /// is validated: creator is 0x + 40 hex digits (mixed case must pass
    /// EIP-55), volume an integer 0..=2^256-1 written with digits only, period a
    /// date not in the future, no duplicate (period, creator), valid UTF-8, at
    /// most 4 KiB per line. All or nothing by default: any error imports
    /// nothing, prints the first 50 errors and exits 1. Importing the same file
    /// again changes nothing. A period whose run has started is refused.
    Import {
        /// The file, or - for standard input.
        file: PathBuf,
        /// The format (default: from the extension: .jsonl/.ndjson, else csv).
        #[arg(long, value_enum)]
        format: Option<crate::import::Format>,
        /// The period of every row (the file may then leave it out).
        #[arg(long)]
        period: Option<Period>,
        /// Import the valid rows anyway and write the rejected ones, with
        /// their line and reason, to this CSV file.
        #[arg(long, value_name = "REJECTS_FILE")]
        skip_invalid: Option<PathBuf>,
        /// Write every error (not only the first 50) to this file.
        #[arg(long, value_name = "FILE")]
        errors: Option<PathBuf>,
        /// Allow adding rows to a period that has rows from another import
        /// (while its run has not started).
        #[arg(long)]
        append: bool,
    },
    /// Set a period's fee policy: reward = floor(volume * fee_bps / 10000).
    ///
    /// Refused once a run for the period has started.
    Policy {
        /// The period (YYYY-MM-DD).
        #[arg(long)]
        period: Period,
        /// Fee in basis points, 0..=10000.
        #[arg(long)]
        fee_bps: u32,
    },
    /// Run one worker process.
    ///
    /// With --period: join (or start) that period's run, settle until no work
    /// is left, exit 0. Without it: a daemon that keeps running, creates the
    /// run of the previous local day at each due time of --schedule (exactly
    /// one server's insert creates it; the others join), creates missed runs of
    /// the last --catch-up-days days oldest first, settles any running run,
    /// and wakes on NOTIFY or polls (at most --max-poll-ms).
    ///
    /// Start as many as you like, on as many hosts as you like, against one
    /// database: they split the work without waiting for each other. SIGTERM or
    /// SIGINT stops claiming; work in flight commits or is given back.
    Worker {
        /// The period to settle, then exit. Without it: run as a daemon.
        #[arg(long)]
        period: Option<Period>,
        /// Claim loops in this process (each with its own connection), 1..=256.
        #[arg(long, env = "SETTLED_CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256))]
        concurrency: u32,
        /// Creators per claim (one transaction each), 1..=10000.
        #[arg(long, env = "SETTLED_CHUNK", default_value_t = DEFAULT_CHUNK, value_parser = clap::value_parser!(u32).range(1..=10000))]
        chunk: u32,
        /// Cron schedule of the daemon (5 fields, or 6 with seconds first);
        /// each due time settles the previous local day.
        #[arg(long, env = "SETTLED_SCHEDULE", default_value = "0 5 * * *")]
        schedule: String,
        /// IANA time zone of the schedule.
        #[arg(long, env = "SETTLED_TIMEZONE", default_value = "Asia/Seoul")]
        timezone: String,
        /// Create runs missed while no worker was up, this many days back.
        #[arg(long, env = "SETTLED_CATCH_UP_DAYS", default_value_t = 3)]
        catch_up_days: u32,
        /// Serve this worker's Prometheus metrics (claim and handler latency
        /// histograms, its counters) at http://ADDR/metrics.
        #[arg(long, env = "SETTLED_METRICS_BIND")]
        metrics_bind: Option<std::net::SocketAddr>,
        /// Longest pause between two looks when idle, in milliseconds.
        #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
        max_poll_ms: u64,
        /// Simulated work per creator in milliseconds (demos, benchmarks,
        /// crash tests): inside the transaction in tx mode, outside in leased mode.
        #[arg(long, default_value_t = 0)]
        work_ms: u64,
        #[command(flatten)]
        engine: EngineFlags,
    },
    /// Start (or join) the run of a period now; or cancel it.
    ///
    /// Idempotent: a running run is joined, a finished run is reported and left
    /// alone, a cancelled run is resumed. --wait drives it with workers in this
    /// process until it finishes. --cancel stops it: workers claim nothing more
    /// for it and its leased items are given back.
    Run {
        /// The period (YYYY-MM-DD).
        #[arg(long)]
        period: Period,
        /// Settle it here until it finishes, then print its report.
        #[arg(long, conflicts_with = "cancel")]
        wait: bool,
        /// Cancel the run.
        #[arg(long)]
        cancel: bool,
        /// Claim loops with --wait.
        #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256))]
        concurrency: u32,
        /// Creators per claim with --wait.
        #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = clap::value_parser!(u32).range(1..=10000))]
        chunk: u32,
    },
    /// List runs, newest first: state, starter, timing, report summary.
    Runs {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List worker processes: host, pid, version, heartbeat, alive/stopped/dead.
    Workers {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve the HTTP API: payouts (idempotent), holds, creators, /healthz,
    /// /openapi.json.
    ///
    /// Mutating endpoints need `Authorization: Bearer $SETTLED_API_TOKEN`.
    /// Any number of servers may serve one database: every once-only rule is
    /// kept by the database.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: std::net::SocketAddr,
        /// Bearer token for mutating endpoints.
        #[arg(long, env = "SETTLED_API_TOKEN", hide_env_values = true)]
        api_token: Option<String>,
        /// How long idempotency keys and their responses are kept, in hours.
        #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(1..=24 * 90))]
        idempotency_retention_hours: u64,
    },
    /// Named leases with fencing tokens (for scripts and operators).
    ///
    /// `acquire` takes a named lease for --ttl-ms on the database clock and
    /// prints its fence (exit 1 while someone else holds it); with --hold-ms it
    /// keeps it that long, then releases it. `release` gives it back if the
    /// fence still holds (exit 1 when it was lost: a stale holder is refused).
    Lease {
        #[command(subcommand)]
        action: LeaseAction,
    },
    /// Put a period's failed items back to eligible (all, or one creator's).
    ///
    /// Their attempts so far stop counting toward --max-attempts; their
    /// attempt numbers (fences) keep growing, so no old claim can complete them.
    Retry {
        /// The period (YYYY-MM-DD).
        #[arg(long)]
        period: Period,
        /// Only this creator (0x + 40 hex digits).
        #[arg(long)]
        creator: Option<String>,
    },
    /// Run a local payment provider for tests, demos and chaos runs.
    ///
    /// Stores payments by idempotency key (a repeat returns the first payment
    /// and pays nothing more) and injects faults: latency, 503 errors before
    /// applying, and "applied, then answered too late". Faults can also be
    /// changed while it runs with POST /v1/faults.
    ProviderSim {
        /// Port on 127.0.0.1.
        #[arg(long, default_value_t = 9100)]
        port: u16,
        /// Latency added to every call, in milliseconds.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Share of new payments refused with 503 before anything is applied (0..=1).
        #[arg(long, default_value_t = 0.0)]
        error_rate: f64,
        /// Share of new payments applied and then answered too late (0..=1).
        #[arg(long, default_value_t = 0.0)]
        applied_timeout_rate: f64,
        /// How late such an answer comes, in milliseconds.
        #[arg(long, default_value_t = 5_000)]
        applied_timeout_ms: u64,
        /// Seed of the fault generator.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Settle a period while injecting faults, then prove nothing was paid
    /// twice or lost.
    ///
    /// On a fresh database of its own (a throwaway private PostgreSQL, or a new
    /// database on DATABASE_URL's server), it runs --workers worker processes
    /// and injects, from a schedule seeded by --seed: SIGKILL of a worker (then
    /// a new one), SIGSTOP of a worker past its lease then SIGCONT (a zombie),
    /// pg_terminate_backend on worker connections, a PostgreSQL restart (when
    /// it runs the server), and in leased mode provider errors and "applied,
    /// then timed out". Then it checks every invariant. Exit 0 only if all hold.
    Chaos {
        /// Creators to settle.
        #[arg(long, default_value_t = 20_000)]
        creators: u64,
        /// Worker processes.
        #[arg(long, default_value_t = 4)]
        workers: u32,
        /// Length of the fault schedule in seconds (the work is spread over it).
        #[arg(long, default_value_t = 60)]
        duration: u64,
        /// Seed of the schedule; the same seed replays the same schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Worker mode.
        #[arg(long, value_enum, default_value_t = Mode::Leased)]
        mode: Mode,
        /// Claim loops per worker.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
        concurrency: u32,
        /// Creators per claim.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10000))]
        chunk: u32,
        /// Lease ttl in milliseconds (short, so zombies and rescues happen often).
        #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(300..=600_000))]
        lease_ttl_ms: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure claiming strategies, the SQL floors and peer job queues.
    ///
    /// Each case settles the same seeded period on a fresh database (on
    /// DATABASE_URL's server, or on a private throwaway server, fsync on,
    /// started in a temporary directory for the run; --data-dir is not used) with W
    /// `settled bench-worker` processes, started and connected before the
    /// clock starts. Records creators/s, scaling efficiency, claim latency
    /// p50/p99, sessions waiting on locks (sampled from pg_stat_activity),
    /// transactions per item and verify's result (a case that fails verify is
    /// reported as failed). Floors: the same SQL under pgbench, and one
    /// set-based transaction. Peers: the scripts under --peers-dir. Prints a
    /// markdown table; --out DIR also writes results.json, results.md and
    /// SVG/PNG plots. Exit 1 if any case failed.
    Bench {
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
        strategies: Option<Vec<crate::bench::Strategy>>,
        /// Items per claim without simulated work.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10000))]
        chunk: u32,
        /// Items per claim with simulated work (small, so every worker gets some).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10000))]
        work_chunk: u32,
        /// Redis for the redis-lock strategy (skipped when none answers).
        #[arg(long, env = "SETTLED_BENCH_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
        /// Peer job queues to measure, comma separated, or `none`
        /// [default: graphile-worker,pg-boss,pgqueuer,apalis; quick: none].
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
        /// Write results.json, results.md and plots (SVG, PNG) here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the report as JSON instead of markdown.
        #[arg(long)]
        json: bool,
        /// Measure nothing: redraw results.md and the plots into --out from
        /// an earlier run's results.json.
        #[arg(long, value_name = "RESULTS_JSON", requires = "out")]
        replot: Option<PathBuf>,
    },
    /// One worker of a `settled bench` case (started by `settled bench`).
    #[command(hide = true)]
    BenchWorker {
        #[command(flatten)]
        args: crate::bench::child::ChildArgs,
    },
    /// Show exact counts by status and amounts paid for a period.
    Status {
        /// The period (YYYY-MM-DD).
        #[arg(long)]
        period: Period,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Prove from committed state that a period was paid exactly once and
    /// money is conserved; exit 1 and list offenders otherwise.
    ///
    /// Checks: a policy exists; no work left; every settled creator has one
    /// ledger row; no ledger row lacks its settled item; every amount follows
    /// the policy; the ledger total equals the expected total; every balance
    /// equals its ledger total.
    Verify {
        /// The period (YYYY-MM-DD).
        #[arg(long)]
        period: Period,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also reconcile with this payment provider: one payment per paid
        /// creator, same amount, none for anyone unpaid.
        #[arg(long)]
        provider_url: Option<String>,
    },
    /// Seed a period, settle it with several worker processes, verify, summarize.
    ///
    /// Each demo settles a fresh period (the day before the earliest one seeded),
    /// or resumes an interrupted one. Exit 0 only if verification holds.
    Demo {
        /// Creators to seed.
        #[arg(long, default_value_t = 100_000)]
        creators: u64,
        /// Worker OS processes to start.
        #[arg(long, default_value_t = 4)]
        workers: u32,
        /// Claim loops per worker process, 1..=256.
        #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256))]
        concurrency: u32,
        /// Creators per claim, 1..=10000.
        #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = clap::value_parser!(u32).range(1..=10000))]
        chunk: u32,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The period's fee in basis points.
        #[arg(long, default_value_t = DEFAULT_FEE_BPS)]
        fee_bps: u32,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `settled lease` actions.
#[derive(Debug, Subcommand)]
pub enum LeaseAction {
    /// Acquire a lease; print `{"name", "holder", "fence"}`.
    Acquire {
        /// The lease's name.
        #[arg(long)]
        name: String,
        /// Time to live in milliseconds.
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
        ttl_ms: u64,
        /// Who holds it (default: host:pid).
        #[arg(long)]
        holder: Option<String>,
        /// Keep it this long, then release it, in milliseconds.
        #[arg(long)]
        hold_ms: Option<u64>,
    },
    /// Release a lease held with this fence.
    Release {
        /// The lease's name.
        #[arg(long)]
        name: String,
        /// The fence it was acquired with.
        #[arg(long)]
        fence: i64,
    },
}

/// Engine settings shared by commands that run workers.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineFlags {
    /// tx: claim, pay and mark settled in one transaction (ledger only).
    /// leased: claim with a lease, pay through --provider-url outside any
    /// transaction, complete with a fenced write.
    #[arg(long, env = "SETTLED_MODE", value_enum, default_value_t = Mode::Tx)]
    pub mode: Mode,
    /// The payment provider for leased mode (e.g. http://127.0.0.1:9100).
    #[arg(long, env = "SETTLED_PROVIDER_URL")]
    pub provider_url: Option<String>,
    /// Provider call timeout in milliseconds.
    #[arg(long, default_value_t = crate::provider::DEFAULT_PROVIDER_TIMEOUT_MS)]
    pub provider_timeout_ms: u64,
    /// Lease time to live in milliseconds (leased mode), renewed every ttl/3.
    #[arg(long, env = "SETTLED_LEASE_TTL_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(300..=3_600_000))]
    pub lease_ttl_ms: u64,
    /// How often the rescuer looks for expired leases, in milliseconds.
    #[arg(long, env = "SETTLED_RESCUE_INTERVAL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    pub rescue_interval_ms: u64,
    /// Attempts before an item goes to failed.
    #[arg(long, env = "SETTLED_MAX_ATTEMPTS", default_value_t = settled_engine::queue::DEFAULT_MAX_ATTEMPTS, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: i32,
    /// First retry backoff in milliseconds (doubles per attempt, with jitter).
    #[arg(long, default_value_t = 1_000)]
    pub backoff_base_ms: u64,
    /// Longest retry backoff in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub backoff_cap_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight work may finish before the
    /// rest is given back, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub shutdown_grace_ms: u64,
}

impl EngineFlags {
    /// Lease timings.
    pub fn leases(&self) -> settled_engine::LeaseConfig {
        settled_engine::LeaseConfig {
            ttl: Duration::from_millis(self.lease_ttl_ms),
            rescue_interval: Duration::from_millis(self.rescue_interval_ms),
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
        }
    }

    /// Retry policy.
    pub fn retry(&self) -> settled_engine::RetryPolicy {
        settled_engine::RetryPolicy {
            max_attempts: self.max_attempts,
            backoff_base_ms: self.backoff_base_ms,
            backoff_cap_ms: self.backoff_cap_ms.max(self.backoff_base_ms),
        }
    }
}

/// Parses arguments, runs the command, maps the outcome to an exit code.
pub fn main() -> ExitCode {
    if let Err(err) = crate::config::load_into_env() {
        eprintln!("error: {err:#}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // A worker's claim loops mostly wait on the database: one thread is
    // enough, and more only compete with PostgreSQL for the same cores.
    let single_threaded = matches!(cli.command, Command::Worker { .. } | Command::BenchWorker { .. });
    let built = if single_threaded {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: starting the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            if let Some(settled_testkit::Error::NoBinaries) = err.downcast_ref::<settled_testkit::Error>() {
                eprintln!("error: {}", settled_testkit::Error::NoBinaries);
                return ExitCode::from(2);
            }
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable (colored on a terminal).
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SETTLED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Human => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn pool_size(command: &Command) -> u32 {
    match command {
        Command::Worker { concurrency, .. } | Command::Run { concurrency, .. } => concurrency + 4,
        Command::Serve { .. } => 32,
        _ => 4,
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Chaos {
        creators,
        workers,
        duration,
        seed,
        mode,
        concurrency,
        chunk,
        lease_ttl_ms,
        json,
    } = cli.command
    {
        let report = crate::chaos::chaos(crate::chaos::ChaosOptions {
            creators,
            workers,
            duration,
            seed,
            mode,
            concurrency,
            chunk,
            lease_ttl_ms,
            database_url: cli.database_url.clone().filter(|u| !u.is_empty()),
        })
        .await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.render());
        }
        return Ok(if report.ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    if let Command::BenchWorker { args } = cli.command {
        let url = cli
            .database_url
            .clone()
            .filter(|u| !u.is_empty())
            .context("bench-worker needs DATABASE_URL (settled bench sets it)")?;
        crate::bench::bench_worker(&url, args).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Bench {
        quick,
        creators,
        work_creators,
        workers,
        work_ms,
        strategies,
        chunk,
        work_chunk,
        redis_url,
        peers,
        peers_dir,
        peer_time_limit,
        no_floors,
        memory_concurrency,
        out,
        json,
        replot,
    } = cli.command
    {
        if let (Some(results), Some(out)) = (&replot, &out) {
            let report = crate::bench::replot(results, out)?;
            eprintln!(
                "bench: redrew results.md and plots in {} from {}",
                out.display(),
                results.display()
            );
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
            return Ok(ExitCode::SUCCESS);
        }
        let default_peers = if quick {
            Vec::new()
        } else {
            crate::bench::DEFAULT_PEERS.iter().map(|p| p.to_string()).collect()
        };
        let peers = match peers {
            Some(list) if list.iter().any(|p| p == "none") => Vec::new(),
            Some(list) => list,
            None => default_peers,
        };
        let opts = crate::bench::BenchOptions {
            creators: creators.unwrap_or(if quick { 5_000 } else { 50_000 }),
            work_creators: work_creators.unwrap_or(if quick { 400 } else { 3_000 }),
            workers: workers.unwrap_or_else(|| if quick { vec![1, 4] } else { vec![1, 2, 4, 8, 16] }),
            work_ms,
            strategies: strategies.unwrap_or_else(|| crate::bench::Strategy::ALL.to_vec()),
            chunk,
            work_chunk,
            redis_url,
            peers,
            peers_dir,
            peer_time_limit,
            floors: !no_floors,
            memory_concurrency,
            out,
            database_url: cli.database_url.clone().filter(|u| !u.is_empty()),
            command: std::iter::once("settled".to_string())
                .chain(std::env::args().skip(1))
                .collect::<Vec<_>>()
                .join(" "),
        };
        let report = crate::bench::bench(&opts).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", crate::bench::markdown(&report));
        }
        let all_ok = report.cases.iter().all(|c| c.ok());
        return Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    if let Command::ProviderSim {
        port,
        latency_ms,
        error_rate,
        applied_timeout_rate,
        applied_timeout_ms,
        seed,
    } = cli.command
    {
        let faults = crate::provider_sim::Faults {
            latency_ms,
            error_rate,
            applied_timeout_rate,
            applied_timeout_ms,
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("binding 127.0.0.1:{port}"))?;
        eprintln!("provider simulator on http://127.0.0.1:{port}");
        crate::provider_sim::serve(listener, faults, seed).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = DbOptions {
        url: cli.database_url.clone().filter(|u| !u.is_empty()),
        data_dir: cli.data_dir.clone(),
        max_connections: pool_size(&cli.command),
        role: if cli.role_per_command {
            least_role(&cli.command)
        } else {
            None
        },
        application_name: match &cli.command {
            Command::Worker { .. } => "settled-worker".to_string(),
            _ => "settled".to_string(),
        },
    };
    let db = Database::open(&opts).await?;
    let result = run_command(&db, cli.command).await;
    db.close().await?;
    result
}

async fn run_command(db: &Database, command: Command) -> anyhow::Result<ExitCode> {
    let pool = &db.pool;
    match command {
        Command::Migrate => {
            println!("migrations applied");
        }
        Command::Seed {
            period,
            creators,
            seed: seed_value,
            fee_bps,
        } => {
            let fee = fee_bps.map(FeeBps::new).transpose().map_err(anyhow::Error::msg)?;
            let bar = Progress::new("seed", creators);
            let outcome = seed::seed(pool, period, creators, seed_value, fee, &bar).await?;
            println!(
                "seeded period {period}: {} creators inserted, {} already present, fee {} bps",
                outcome.inserted, outcome.already_present, outcome.fee_bps
            );
        }
        Command::Policy { period, fee_bps } => {
            let fee = FeeBps::new(fee_bps).map_err(anyhow::Error::msg)?;
            settlement::set_policy(pool, period, fee).await?;
            println!("policy of {period}: fee {fee} bps");
        }
        Command::Worker {
            period,
            concurrency,
            chunk,
            work_ms,
            engine,
            schedule,
            timezone,
            catch_up_days,
            max_poll_ms,
            metrics_bind,
        } => {
            if engine.mode == Mode::Leased && engine.provider_url.is_none() {
                tracing::warn!("leased mode without --provider-url: nothing is paid outside the database");
            }
            let opts = WorkerOptions {
                period,
                concurrency,
                chunk,
                work_ms,
                mode: engine.mode,
                provider_url: engine.provider_url.clone(),
                provider_timeout: Duration::from_millis(engine.provider_timeout_ms),
                leases: engine.leases(),
                retry: engine.retry(),
                metrics_bind,
            };
            if period.is_none() {
                let daemon = worker::DaemonOptions {
                    schedule: settled_engine::Schedule::parse(&schedule, &timezone)?,
                    catch_up_days,
                    max_poll: Duration::from_millis(max_poll_ms),
                };
                worker::run_daemon(pool, &opts, &daemon).await?;
                println!("worker daemon stopped");
                return Ok(ExitCode::SUCCESS);
            }
            let outcome = worker::run_worker(pool, &opts).await?;
            match outcome {
                WorkerOutcome::NothingToDo => println!("no running run; nothing to do"),
                WorkerOutcome::RunNotRunning(id, state) => {
                    println!("run {id} is {}; nothing to do", state.as_str())
                }
                WorkerOutcome::Drained {
                    run_id,
                    settled,
                    finished,
                } => println!(
                    "run {run_id}: settled {settled} creators in this process; run {}",
                    if finished {
                        "finished by this worker"
                    } else {
                        "finished or finishing"
                    }
                ),
                WorkerOutcome::Stopped { run_id, settled } => {
                    println!("run {run_id}: stopped by signal after settling {settled} creators")
                }
            }
        }
        Command::Status { period, json } => {
            let mut conn = pool.acquire().await?;
            let status = status::period_status(&mut conn, period).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", status.render());
            }
        }
        Command::Run {
            period,
            wait,
            cancel,
            concurrency,
            chunk,
        } => return crate::runs_cmd::run(pool, period, wait, cancel, concurrency, chunk).await,
        Command::Runs { limit, json } => crate::runs_cmd::list_runs(pool, limit, json).await?,
        Command::Workers { limit, json } => crate::runs_cmd::list_workers(pool, limit, json).await?,
        Command::Retry { period, creator } => {
            let creator = creator.map(|c| crate::address::CreatorAddress::parse(&c)).transpose()?;
            let n = settlement::retry_failed(pool, period, creator.as_ref()).await?;
            println!("{n} failed item(s) of {period} put back to eligible");
        }
        Command::Import {
            file,
            format,
            period,
            skip_invalid,
            errors,
            append,
        } => {
            let opts = crate::import::ImportOptions {
                path: file.clone(),
                format,
                period,
                skip_invalid,
                errors_file: errors.clone(),
                append,
            };
            let started = std::time::Instant::now();
            let outcome = crate::import::import(pool, &opts).await?;
            for line in &outcome.first_errors {
                eprintln!("{line}");
            }
            if outcome.errors as usize > outcome.first_errors.len() {
                eprintln!(
                    "... and {} more{}",
                    outcome.errors as usize - outcome.first_errors.len(),
                    if errors.is_some() {
                        " (all of them in --errors)"
                    } else {
                        " (use --errors FILE to see all)"
                    }
                );
            }
            if outcome.refused {
                eprintln!(
                    "{}: {} error(s) in {} rows; nothing was imported",
                    file.display(),
                    outcome.errors,
                    outcome.rows
                );
                return Ok(ExitCode::from(1));
            }
            println!(
                "{}: {} rows read, {} imported, {} already present, {} rejected, in {:.1} s",
                file.display(),
                outcome.rows,
                outcome.inserted,
                outcome.already_present,
                outcome.rejected,
                started.elapsed().as_secs_f64()
            );
        }
        Command::Lease { action } => {
            use settled_engine::named_lease::{release_fenced, Lease};
            match action {
                LeaseAction::Acquire {
                    name,
                    ttl_ms,
                    holder,
                    hold_ms,
                } => {
                    let holder = holder.unwrap_or_else(|| {
                        let host = nix::unistd::gethostname()
                            .ok()
                            .and_then(|h| h.into_string().ok())
                            .unwrap_or_default();
                        format!("{host}:{}", std::process::id())
                    });
                    let Some(lease) = Lease::acquire(pool, &name, &holder, Duration::from_millis(ttl_ms)).await? else {
                        eprintln!("lease {name:?} is held by someone else");
                        return Ok(ExitCode::from(1));
                    };
                    println!("{}", serde_json::to_string(&lease)?);
                    if let Some(ms) = hold_ms {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        if !lease.release(pool).await? {
                            eprintln!("lease {name:?} was lost before its release (fence {})", lease.fence);
                            return Ok(ExitCode::from(1));
                        }
                    }
                }
                LeaseAction::Release { name, fence } => {
                    if release_fenced(pool, &name, fence).await? {
                        println!("lease {name:?} released");
                    } else {
                        eprintln!("lease {name:?} is not held with fence {fence}: refused");
                        return Ok(ExitCode::from(1));
                    }
                }
            }
        }
        Command::ProviderSim { .. } | Command::Chaos { .. } | Command::Bench { .. } | Command::BenchWorker { .. } => {
            unreachable!("run without the default database")
        }
        Command::Serve {
            bind,
            api_token,
            idempotency_retention_hours,
        } => {
            let state = crate::api::AppState {
                pool: pool.clone(),
                api_token: api_token.filter(|t| !t.is_empty()).map(Into::into),
                idempotency: settled_engine::idempotency::IdempotencyConfig {
                    retention: Duration::from_secs(idempotency_retention_hours * 3600),
                    ..Default::default()
                },
            };
            if state.api_token.is_none() {
                tracing::warn!("no SETTLED_API_TOKEN: mutating endpoints answer 401");
            }
            let listener = tokio::net::TcpListener::bind(bind)
                .await
                .with_context(|| format!("binding {bind}"))?;
            eprintln!("settled serve on http://{}", listener.local_addr()?);
            crate::api::serve(listener, state).await?;
        }
        Command::Verify {
            period,
            json,
            provider_url,
        } => {
            let mut conn = pool.acquire().await?;
            let mut report = verify::verify(&mut conn, period).await?;
            if let Some(url) = provider_url {
                let provider = crate::provider::HttpProvider::new(&url, Duration::from_secs(60))?;
                verify::reconcile_provider(&mut conn, period, &provider, &mut report).await?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            if !report.ok {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Demo {
            creators,
            workers,
            concurrency,
            chunk,
            seed: seed_value,
            fee_bps,
            json,
        } => {
            let opts = demo::DemoOptions {
                creators,
                workers,
                concurrency,
                chunk,
                seed: seed_value,
                fee: FeeBps::new(fee_bps).map_err(anyhow::Error::msg)?,
            };
            match db.private_server() {
                Some(server) => eprintln!(
                    "using the private PostgreSQL in {} (socket {}, port {})",
                    server.pgdata().display(),
                    server.socket_dir().display(),
                    server.port()
                ),
                None => eprintln!("using DATABASE_URL {}", crate::db::redact_url(&db.url)),
            }
            let (summary, report) = demo::demo(pool, &db.url, &opts).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print!("{}", report.render());
                print!("{}", summary.render());
            }
            if !summary.verified {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
