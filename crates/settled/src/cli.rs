//! Command-line interface. Exit codes: 0 success; 1 the command ran and found
//! a problem (verification failed, a worker failed, bad input); 2 it could
//! not start (bad usage, no database and no PostgreSQL server binaries).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::db::{Database, DbOptions};
use crate::money::FeeBps;
use crate::period::Period;
use crate::progress::Progress;
use crate::settlement::DEFAULT_FEE_BPS;
use crate::worker::{WorkerOptions, WorkerOutcome};
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
    #[arg(
        long,
        env = "SETTLED_DATA_DIR",
        default_value = ".settled",
        global = true
    )]
    pub data_dir: PathBuf,

    #[command(subcommand)]
    pub command: Command,
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
    /// Run one worker process: join (or start) the period's run and settle
    /// until no work is left, then exit 0.
    ///
    /// Start as many as you like, on as many hosts as you like, against one
    /// database: they split the work without waiting for each other. SIGTERM or
    /// SIGINT stops claiming; chunks in flight commit or roll back whole.
    Worker {
        /// The period to settle. Without it, join the running run, if any.
        #[arg(long)]
        period: Option<Period>,
        /// Claim loops in this process (each with its own connection), 1..=256.
        #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256))]
        concurrency: u32,
        /// Creators per claim (one transaction each), 1..=10000.
        #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = clap::value_parser!(u32).range(1..=10000))]
        chunk: u32,
        /// Simulated work per creator in milliseconds, spent inside the
        /// transaction (for demos, benchmarks and crash tests).
        #[arg(long, default_value_t = 0)]
        work_ms: u64,
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

/// Parses arguments, runs the command, maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: starting the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            if let Some(settled_testkit::Error::NoBinaries) =
                err.downcast_ref::<settled_testkit::Error>()
            {
                eprintln!("error: {}", settled_testkit::Error::NoBinaries);
                return ExitCode::from(2);
            }
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SETTLED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn pool_size(command: &Command) -> u32 {
    match command {
        Command::Worker { concurrency, .. } => concurrency + 2,
        _ => 4,
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let opts = DbOptions {
        url: cli.database_url.clone().filter(|u| !u.is_empty()),
        data_dir: cli.data_dir.clone(),
        max_connections: pool_size(&cli.command),
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
            let fee = fee_bps
                .map(FeeBps::new)
                .transpose()
                .map_err(anyhow::Error::msg)?;
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
        } => {
            let outcome = worker::run_worker(
                pool,
                &WorkerOptions {
                    period,
                    concurrency,
                    chunk,
                    work_ms,
                },
            )
            .await?;
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
        Command::Verify { period, json } => {
            let mut conn = pool.acquire().await?;
            let report = verify::verify(&mut conn, period).await?;
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
