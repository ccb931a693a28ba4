//! `settled bench`: the same settlement under each claiming strategy, at
//! each worker count, on a fresh database per case, with the SQL floors and
//! the peer job queues measured in the same run.
//!
//! Every case: create a database, seed N creators, refresh statistics, start
//! the run; start W `settled bench-worker` processes and wait until all are
//! connected; send `go` and start the clock; stop it when the last exits.
//! Meanwhile a sampler reads `pg_stat_activity` every few milliseconds for
//! sessions waiting on a lock. Afterwards: transactions per item from
//! `pg_stat_database`, and `verify` (a case that fails it is reported as
//! failed, never as fast). Then the database is dropped.

mod casedb;
pub mod chain;
pub mod child;
pub mod continuous;
pub(crate) mod floors;
mod markdown;
pub mod pairs;
pub mod payouts;
mod peers;
mod plot;
mod report;
pub mod soak;
mod strategy;
mod targets;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use settled_embedded::{LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};

pub use markdown::markdown;
pub use report::{BenchReport, CaseResult};
pub use targets::Target;

use settled::progress::Progress;

/// Largest worker count of one case.
pub const MAX_BENCH_WORKERS: u32 = 64;
/// Largest number of creators of one case.
pub const MAX_BENCH_CREATORS: u64 = 10_000_000;
/// How often the sampler reads `pg_stat_activity`. Each read costs the
/// server about half a millisecond of a backend; every 10 ms that was 5% of
/// one core taken from the strategies on a two-core machine and not from
/// the floors, which are not sampled.
pub const SAMPLE_EVERY_MS: u64 = 50;
/// Longest a strategy case may run before its workers are killed and the
/// case is reported as failed.
pub const CASE_TIMEOUT_SECS: u64 = 3_600;
/// How long a worker process may take to connect and say `ready`.
pub const READY_TIMEOUT_SECS: u64 = 60;
/// The peers measured by default (directories of `--peers-dir`).
pub const DEFAULT_PEERS: [&str; 5] = ["graphile-worker", "pg-boss", "pgqueuer", "apalis", "awa"];
/// Seed of the synthetic creators (the same data in every case).
pub const BENCH_SEED: u64 = 1;

/// How workers split (or fail to split) the work.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// A Redis `SET NX PX` lock around each worker's whole batch loop.
    RedisLock,
    /// `pg_advisory_lock` on one key around each worker's whole batch loop.
    AdvisoryLock,
    /// Chunk claims with plain `FOR UPDATE` (no SKIP LOCKED).
    ForUpdate,
    /// Worker k claims `OFFSET k*chunk LIMIT chunk FOR UPDATE`.
    Offset,
    /// One item per claim with SKIP LOCKED (a per-row job queue).
    SkipLockedItem,
    /// `settled worker` in-transaction mode: chunk claims with SKIP LOCKED.
    SkipLockedChunk,
    /// `settled worker --mode leased`: leased chunks, work outside the transaction.
    SkipLockedLeased,
}

impl Strategy {
    /// Every strategy, in report order.
    pub const ALL: [Strategy; 7] = [
        Strategy::RedisLock,
        Strategy::AdvisoryLock,
        Strategy::ForUpdate,
        Strategy::Offset,
        Strategy::SkipLockedItem,
        Strategy::SkipLockedChunk,
        Strategy::SkipLockedLeased,
    ];

    /// The strategy's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::RedisLock => "redis-lock",
            Strategy::AdvisoryLock => "advisory-lock",
            Strategy::ForUpdate => "for-update",
            Strategy::Offset => "offset",
            Strategy::SkipLockedItem => "skip-locked-item",
            Strategy::SkipLockedChunk => "skip-locked-chunk",
            Strategy::SkipLockedLeased => "skip-locked-leased",
        }
    }
}

/// What `settled bench` measures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BenchOptions {
    /// Creators per case without simulated work.
    pub creators: u64,
    /// Creators per case with simulated work (`work_ms` > 0).
    pub work_creators: u64,
    /// Worker counts.
    pub workers: Vec<u32>,
    /// Simulated per-item work, one set of cases each.
    pub work_ms: Vec<u64>,
    /// Strategies to measure.
    pub strategies: Vec<Strategy>,
    /// Items per claim without simulated work.
    pub chunk: u32,
    /// Claim loops per worker process of the strategy cases and the rounds
    /// of `pairs` (`settled worker --concurrency`).
    #[serde(default = "one_loop")]
    pub concurrency: u32,
    /// Items per claim with simulated work.
    pub work_chunk: u32,
    /// Redis for `redis-lock`.
    #[serde(skip)]
    pub redis_url: String,
    /// Peer job queues to measure (names of `bench/peers/*`).
    pub peers: Vec<String>,
    /// Where the peer scripts live.
    pub peers_dir: PathBuf,
    /// Longest a peer case may run; then its rate is of what it settled.
    #[serde(default)]
    pub peer_time_limit: u64,
    /// Measure the pgbench and set-based floors.
    pub floors: bool,
    /// Claim loops of the one worker process whose memory is measured (0: skip).
    pub memory_concurrency: u32,
    /// The soak instead of the cases: this many daily periods on one database.
    pub days: Option<u32>,
    /// The soak's retention: periods older than this many days are archived (0: never).
    pub retain_days: u32,
    /// The held-snapshot pair instead of the cases.
    pub held_xmin: bool,
    /// Same-run pairs (product, set-based) instead of the cases: this many.
    #[serde(default)]
    pub pairs: Option<u32>,
    /// The soak: set the balances' fillfactor to this before day 1 (None:
    /// the migrations' setting).
    pub balance_fillfactor: Option<u32>,
    /// Where to write results.json, results.md and the plots.
    #[serde(skip)]
    pub out: Option<PathBuf>,
    /// The server to measure (None: a private one, started for the run).
    #[serde(skip)]
    pub database_url: Option<String>,
    /// The command line, for the report.
    pub command: String,
}

fn one_loop() -> u32 {
    1
}

/// What a long-life benchmark measured.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum LongLife {
    /// `--days`.
    Soak(soak::SoakReport),
    /// `--held-xmin`.
    HeldXmin(Vec<soak::HeldXminCase>),
    /// `--pairs`.
    Pairs(pairs::PairsReport),
}

impl LongLife {
    /// The markdown rendering.
    pub fn markdown(&self, opts: &BenchOptions) -> String {
        match self {
            LongLife::Soak(r) => r.markdown(),
            LongLife::HeldXmin(cases) => soak::held_xmin_markdown(opts.creators, cases),
            LongLife::Pairs(report) => pairs::pairs_markdown(report),
        }
    }
}

/// The soak (`opts.days`), the held-snapshot pair (`opts.held_xmin`) or
/// the same-run pairs (`opts.pairs`), on DATABASE_URL's server or a private
/// one started for it.
pub async fn long_life(opts: &BenchOptions) -> anyhow::Result<LongLife> {
    anyhow::ensure!(
        (1..=MAX_BENCH_CREATORS).contains(&opts.creators),
        "--creators must be 1..={MAX_BENCH_CREATORS}"
    );
    if let Some(days) = opts.days {
        anyhow::ensure!((1..=3650).contains(&days), "--days must be 1..=3650");
    }
    // A soak day takes seconds, not 24 hours: autovacuum looks every second
    // (instead of every minute) so it gets its chances between days.
    let settings = if opts.days.is_some() {
        vec![format!("autovacuum_naptime={}s", soak::SOAK_NAPTIME_SECS)]
    } else {
        Vec::new()
    };
    let report = with_ctx(opts, settings, async |ctx| {
        let mut admin = PgConnection::connect(&ctx.admin_url).await?;
        let version: String = sqlx::query_scalar("SELECT version()").fetch_one(&mut admin).await?;
        admin.close().await?;
        warm_up(ctx).await;
        match (opts.days, opts.pairs) {
            (Some(days), _) => anyhow::Ok(LongLife::Soak(soak::soak(ctx, days, opts.retain_days, version).await?)),
            (None, Some(rounds)) => anyhow::Ok(LongLife::Pairs(pairs::pairs(ctx, rounds).await?)),
            (None, None) => anyhow::Ok(LongLife::HeldXmin(soak::held_xmin(ctx).await?)),
        }
    })
    .await?;
    if let Some(out) = &opts.out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&report)?)?;
        std::fs::write(out.join("results.md"), report.markdown(opts))?;
        eprintln!("bench: wrote results.json and results.md to {}", out.display());
    }
    Ok(report)
}

/// Runs `body` in a bench context: on `--database-url`, or on a private
/// server started with `settings` and stopped after it; the case
/// templates dropped after it, whatever it returned.
async fn with_ctx<T>(
    opts: &BenchOptions,
    settings: Vec<String>,
    body: impl AsyncFnOnce(&Ctx) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let scratch = tempfile::Builder::new().prefix("settled-bench-").tempdir()?;
    let (server, admin_url) = start_server_with(opts, scratch.path(), settings).await?;
    let ctx = Ctx {
        admin_url,
        exe: std::env::current_exe().context("locating the settled binary")?,
        scratch: scratch.path().to_path_buf(),
        opts: opts.clone(),
        templates: casedb::Templates::default(),
    };
    let result = body(&ctx).await;
    let dropped = ctx.templates.drop_all(&ctx.admin_url).await;
    if let Some(server) = server {
        tokio::task::spawn_blocking(move || server.stop()).await??;
    }
    let outcome = result?;
    dropped?;
    Ok(outcome)
}

async fn start_server_with(
    opts: &BenchOptions,
    scratch: &Path,
    settings: Vec<String>,
) -> anyhow::Result<(Option<LocalPostgres>, String)> {
    start_server_at(&opts.database_url, scratch, settings).await
}

/// Runs `measure` on a fresh database (with the database's URL and a
/// scratch directory) of `database_url`'s server, or of a private one
/// started for the run; the database is dropped and the private server
/// stopped afterwards, whatever `measure` returned.
async fn on_fresh_database<T, F, Fut>(database_url: &Option<String>, measure: F) -> anyhow::Result<T>
where
    F: FnOnce(String, PathBuf) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let scratch = tempfile::Builder::new().prefix("settled-bench-").tempdir()?;
    let (server, admin_url) = start_server_at(database_url, scratch.path(), Vec::new()).await?;
    let result = async {
        let (name, url) = casedb::create_database_at(&admin_url).await?;
        let measured = measure(url, scratch.path().to_path_buf()).await;
        casedb::drop_database_at(&admin_url, &name).await?;
        measured
    }
    .await;
    if let Some(server) = server {
        tokio::task::spawn_blocking(move || server.stop()).await??;
    }
    result
}

/// `database_url`'s server, or a private one (fsync on) in `scratch`,
/// started for the run; returns it (None: not ours) and its admin URL.
async fn start_server_at(
    database_url: &Option<String>,
    scratch: &Path,
    settings: Vec<String>,
) -> anyhow::Result<(Option<LocalPostgres>, String)> {
    Ok(match database_url {
        Some(url) => (None, url.clone()),
        None => {
            let local = LocalOptions {
                data_dir: scratch.join("pg"),
                throwaway: false,
                remove_on_stop: true,
                max_connections: 300,
                settings,
            };
            eprintln!("bench: starting a private PostgreSQL (fsync on) for the run");
            let server = tokio::task::spawn_blocking(move || LocalPostgres::start(&local)).await??;
            let url = server.url("postgres");
            (Some(server), url)
        }
    })
}

/// Runs the benchmark and returns its report (also written to `opts.out`).
pub async fn bench(opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(!opts.workers.is_empty(), "--workers: give at least one worker count");
    anyhow::ensure!(
        opts.workers.iter().all(|w| (1..=MAX_BENCH_WORKERS).contains(w)),
        "--workers: each count must be 1..={MAX_BENCH_WORKERS}"
    );
    anyhow::ensure!(!opts.work_ms.is_empty(), "--work-ms: give at least one value");
    anyhow::ensure!(
        opts.work_ms.iter().all(|m| *m <= crate::simulate::MAX_WORK_MS),
        "--work-ms: each value must be at most {}",
        crate::simulate::MAX_WORK_MS
    );
    for (flag, n) in [("--creators", opts.creators), ("--work-creators", opts.work_creators)] {
        anyhow::ensure!(
            (1..=MAX_BENCH_CREATORS).contains(&n),
            "{flag} must be 1..={MAX_BENCH_CREATORS}"
        );
    }
    let report = with_ctx(opts, Vec::new(), async |ctx| run_all(ctx).await).await?;
    if let Some(out) = &opts.out {
        report::write(&report, out)?;
        plot::write_plots(&report, out)?;
        eprintln!("bench: wrote results.json, results.md and plots to {}", out.display());
    }
    Ok(report)
}

/// Settles --creators once with the set-based transaction, not counted,
/// before anything is measured. A fresh server makes (and zero-fills) its
/// WAL segments as the first cases write; later cases reuse them. At a
/// million, the first case of a run paid for 1 to 1.5 GB of new WAL and
/// measured a quarter slower than its own later repeats, and the full bench
/// always measures a strategy first.
async fn warm_up(ctx: &Ctx) {
    eprintln!(
        "bench: a warm-up settle of {} creators (not counted)",
        ctx.opts.creators
    );
    let case = floors::set_based_case(ctx, ctx.opts.creators).await;
    if let Some(err) = &case.error {
        eprintln!("bench: the warm-up failed (measuring anyway): {err}");
    }
}

/// What every case needs.
struct Ctx {
    admin_url: String,
    exe: PathBuf,
    scratch: PathBuf,
    opts: BenchOptions,
    /// The seeded databases cases are copied from.
    templates: casedb::Templates,
}

async fn run_all(ctx: &Ctx) -> anyhow::Result<BenchReport> {
    let opts = &ctx.opts;
    let started_at = chrono::Utc::now();
    let mut admin = PgConnection::connect(&ctx.admin_url)
        .await
        .with_context(|| format!("connecting to {}", settled::db::redact_url(&ctx.admin_url)))?;
    let server_version: String = sqlx::query_scalar("SELECT version()").fetch_one(&mut admin).await?;
    admin.close().await?;
    warm_up(ctx).await;
    let mut skipped = Vec::new();
    let redis = redis_answers(&opts.redis_url).await;
    let mut cases = Vec::new();

    let total = (opts.work_ms.len() * opts.strategies.len() * opts.workers.len()) as u64;
    let bar = Progress::new("bench", total);
    let mut done = 0;
    for &work_ms in &opts.work_ms {
        let (n, chunk) = if work_ms == 0 {
            (opts.creators, opts.chunk)
        } else {
            (opts.work_creators, opts.work_chunk)
        };
        for &strategy in &opts.strategies {
            if strategy == Strategy::RedisLock {
                if let Err(why) = &redis {
                    let line = format!("redis-lock skipped: {why}");
                    if !skipped.contains(&line) {
                        bar.println(&format!("bench: {line}"));
                        skipped.push(line);
                    }
                    done += opts.workers.len() as u64;
                    bar.set(done);
                    continue;
                }
            }
            for &workers in &opts.workers {
                let spec = CaseSpec {
                    strategy,
                    workers,
                    concurrency: opts.concurrency,
                    work_ms,
                    creators: n,
                    chunk,
                };
                let case = run_strategy_case(ctx, &spec).await;
                bar.println(&format!("bench: {}", case.summary()));
                cases.push(case);
                done += 1;
                bar.set(done);
            }
        }
    }
    bar.finish();
    if opts.floors {
        match floors::pgbench_program() {
            Some(pgbench) => {
                for &workers in &opts.workers {
                    let case = floors::pgbench_case(
                        ctx,
                        &pgbench,
                        floors::PgbenchFloor::Shared,
                        workers,
                        opts.creators,
                        opts.chunk,
                    )
                    .await;
                    eprintln!("bench: {}", case.summary());
                    cases.push(case);
                }
            }
            None => {
                let line = "pgbench floor skipped: no pgbench next to the server binaries or on PATH".to_string();
                eprintln!("bench: {line}");
                skipped.push(line);
            }
        }
        let case = floors::set_based_case(ctx, opts.creators).await;
        eprintln!("bench: {}", case.summary());
        cases.push(case);
    }
    for peer in &opts.peers {
        match peers::install(ctx, peer).await {
            Ok(()) => {
                for config in peers::CONFIGS {
                    for &workers in &opts.workers {
                        let case = peers::peer_case(ctx, peer, config, workers, opts.creators).await;
                        eprintln!("bench: {}", case.summary());
                        cases.push(case);
                    }
                }
            }
            Err(err) => {
                let line = format!("peer {peer} skipped: {err:#}");
                eprintln!("bench: {line}");
                skipped.push(line);
            }
        }
    }
    if opts.memory_concurrency > 0 {
        let spec = CaseSpec {
            strategy: Strategy::SkipLockedChunk,
            workers: 1,
            concurrency: opts.memory_concurrency,
            work_ms: 0,
            creators: opts.creators,
            chunk: opts.chunk,
        };
        let mut case = run_strategy_case(ctx, &spec).await;
        case.kind = "memory".into();
        eprintln!("bench: {}", case.summary());
        cases.push(case);
    }
    report::fill_efficiency(&mut cases);
    let targets = targets::targets(&cases, opts);
    Ok(BenchReport {
        started_at: started_at.to_rfc3339(),
        finished_at: chrono::Utc::now().to_rfc3339(),
        settled_version: env!("CARGO_PKG_VERSION").to_string(),
        server_version,
        server: match &opts.database_url {
            Some(url) => settled::db::redact_url(url),
            None => "private PostgreSQL started by settled bench (fsync on)".into(),
        },
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        options: opts.clone(),
        cases,
        targets,
        skipped,
    })
}

/// Whether Redis answers PING at `url`.
async fn redis_answers(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| format!("{url} is not a Redis URL: {e}"))?;
    let ping = async {
        let mut con = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    match tokio::time::timeout(Duration::from_secs(3), ping).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("no Redis answers at {url} ({e})")),
        Err(_) => Err(format!("no Redis answers at {url} (timed out)")),
    }
}

/// One strategy case.
#[derive(Debug, Clone)]
struct CaseSpec {
    strategy: Strategy,
    workers: u32,
    concurrency: u32,
    work_ms: u64,
    creators: u64,
    chunk: u32,
}

/// Redraws results.md and the plots in `out` from an earlier results.json;
/// measures nothing.
pub fn replot(results: &Path, out: &Path) -> anyhow::Result<BenchReport> {
    let text = std::fs::read_to_string(results).with_context(|| format!("reading {}", results.display()))?;
    let report: BenchReport =
        serde_json::from_str(&text).with_context(|| format!("{} is not a settled bench report", results.display()))?;
    report::write(&report, out)?;
    plot::write_plots(&report, out)?;
    Ok(report)
}

/// Runs `settled bench-worker` (a hidden command): one worker of a case.
pub async fn bench_worker(url: &str, args: child::ChildArgs) -> anyhow::Result<()> {
    let report = child::run_child(url, args).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Writes `contents` to a file in the scratch directory and returns its path.
fn scratch_file(dir: &Path, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

use casedb::{client_cpu, finish_case, prepare_case, transactions, wait_disconnected, CaseDb};
use strategy::run_strategy_case;
