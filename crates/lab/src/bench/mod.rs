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

pub mod child;
mod floors;
mod peers;
mod plot;
mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use settled_embedded::{LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

pub use report::{markdown, BenchReport, CaseResult, Target};

use settled::period::Period;
use settled::progress::Progress;

/// Largest worker count of one case.
pub const MAX_BENCH_WORKERS: u32 = 64;
/// Largest number of creators of one case.
pub const MAX_BENCH_CREATORS: u64 = 10_000_000;
/// How often the sampler reads `pg_stat_activity`.
pub const SAMPLE_EVERY_MS: u64 = 10;
/// Longest a strategy case may run before its workers are killed and the
/// case is reported as failed.
pub const CASE_TIMEOUT_SECS: u64 = 3_600;
/// How long a worker process may take to connect and say `ready`.
pub const READY_TIMEOUT_SECS: u64 = 60;
/// The peers measured by default (directories of `--peers-dir`).
pub const DEFAULT_PEERS: [&str; 4] = ["graphile-worker", "pg-boss", "pgqueuer", "apalis"];
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
    /// Where to write results.json, results.md and the plots.
    #[serde(skip)]
    pub out: Option<PathBuf>,
    /// The server to measure (None: a private one, started for the run).
    #[serde(skip)]
    pub database_url: Option<String>,
    /// The command line, for the report.
    pub command: String,
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
    let scratch = tempfile::Builder::new().prefix("settled-bench-").tempdir()?;
    let (server, admin_url) = match &opts.database_url {
        Some(url) => (None, url.clone()),
        None => {
            let local = LocalOptions {
                data_dir: scratch.path().join("pg"),
                throwaway: false,
                remove_on_stop: true,
                max_connections: 300,
            };
            eprintln!("bench: starting a private PostgreSQL (fsync on) for the run");
            let server = tokio::task::spawn_blocking(move || LocalPostgres::start(&local)).await??;
            let url = server.url("postgres");
            (Some(server), url)
        }
    };
    let ctx = Ctx {
        admin_url,
        exe: std::env::current_exe().context("locating the settled binary")?,
        scratch: scratch.path().to_path_buf(),
        opts: opts.clone(),
    };
    let result = run_all(&ctx).await;
    if let Some(server) = server {
        tokio::task::spawn_blocking(move || server.stop()).await??;
    }
    let report = result?;
    if let Some(out) = &opts.out {
        report::write(&report, out)?;
        plot::write_plots(&report, out)?;
        eprintln!("bench: wrote results.json, results.md and plots to {}", out.display());
    }
    Ok(report)
}

/// What every case needs.
struct Ctx {
    admin_url: String,
    exe: PathBuf,
    scratch: PathBuf,
    opts: BenchOptions,
}

async fn run_all(ctx: &Ctx) -> anyhow::Result<BenchReport> {
    let opts = &ctx.opts;
    let started_at = chrono::Utc::now();
    let mut admin = PgConnection::connect(&ctx.admin_url)
        .await
        .with_context(|| format!("connecting to {}", settled::db::redact_url(&ctx.admin_url)))?;
    let server_version: String = sqlx::query_scalar("SELECT version()").fetch_one(&mut admin).await?;
    admin.close().await?;
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
                    concurrency: 1,
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
                    let case = floors::pgbench_case(ctx, &pgbench, workers, opts.creators, opts.chunk).await;
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
    let targets = report::targets(&cases, opts);
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

/// A fresh database with a seeded period and a started run.
struct CaseDb {
    name: String,
    url: String,
    period: Period,
    run_id: i64,
}

/// The benchmark's period: yesterday (UTC).
fn bench_period() -> Period {
    Period::from_date(chrono::Utc::now().date_naive() - chrono::Duration::days(1))
}

async fn prepare_case(ctx: &Ctx, creators: u64) -> anyhow::Result<CaseDb> {
    let name = format!("settled_bench_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&ctx.admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .with_context(|| format!("creating database {name}"))?;
    admin.close().await?;
    let url = settled_embedded::with_database(&ctx.admin_url, &name);
    let db = settled::db::Database::open_url(&url, 4, "settled-bench").await?;
    let period = bench_period();
    settled::seed::seed(&db.pool, period, creators, BENCH_SEED, None, &Progress::hidden()).await?;
    let mut conn = db.pool.acquire().await?;
    sqlx::query("ANALYZE settlement.token_trade_volume")
        .execute(&mut *conn)
        .await?;
    drop(conn);
    let run_id = settled::settlement::job()
        .start_or_join(&db.pool, &period.to_string(), None)
        .await?
        .run
        .id;
    db.close().await?;
    Ok(CaseDb {
        name,
        url,
        period,
        run_id,
    })
}

/// Verifies the case's period and drops its database.
async fn finish_case(ctx: &Ctx, db: &CaseDb) -> anyhow::Result<settled::verify::VerifyReport> {
    let verified = async {
        let mut conn = PgConnection::connect(&db.url).await?;
        let report = settled::verify::verify(&mut conn, db.period).await?;
        conn.close().await?;
        anyhow::Ok(report)
    }
    .await;
    let mut admin = PgConnection::connect(&ctx.admin_url).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    verified
}

/// CPU seconds (user + system) of this process's children that have ended
/// and been waited for, their own children included.
pub(super) fn client_cpu() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| {
            let (user, system) = (u.user_time(), u.system_time());
            user.tv_sec() as f64 + user.tv_usec() as f64 / 1e6 + system.tv_sec() as f64 + system.tv_usec() as f64 / 1e6
        })
        .unwrap_or(0.0)
}

/// Ends a case: verifies its period and drops its database (whatever the
/// measurement's outcome), then records the verification.
async fn conclude(ctx: &Ctx, db: &CaseDb, measured: anyhow::Result<()>, case: &mut CaseResult) -> anyhow::Result<()> {
    let verified = finish_case(ctx, db).await;
    measured?;
    case.set_verify(verified?);
    Ok(())
}

/// Transactions committed and rolled back in database `name` so far.
async fn transactions(admin: &mut PgConnection, name: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(xact_commit + xact_rollback), 0)::int8 FROM pg_stat_database WHERE datname = $1",
    )
    .bind(name)
    .fetch_one(admin)
    .await?)
}

/// Waits until no session is connected to database `name` (their statistics
/// are flushed when they end), at most 10 s.
async fn wait_disconnected(admin: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    for _ in 0..200 {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .fetch_one(&mut *admin)
            .await?;
        if left == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Lock waits seen by the sampler.
#[derive(Debug, Default)]
struct LockSamples {
    samples: u64,
    waiting_sum: u64,
    waiting_max: u64,
    samples_with_waiters: u64,
    by_event: BTreeMap<String, u64>,
}

/// Reads `pg_stat_activity` for database `name` until `stop` is set.
async fn sample_locks(admin_url: String, name: String, stop: Arc<AtomicBool>) -> anyhow::Result<LockSamples> {
    let mut conn = PgConnection::connect(&admin_url).await?;
    let mut s = LockSamples::default();
    while !stop.load(Ordering::Relaxed) {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT wait_event, count(*) FROM pg_stat_activity
             WHERE datname = $1 AND wait_event_type = 'Lock' GROUP BY wait_event",
        )
        .bind(&name)
        .fetch_all(&mut conn)
        .await?;
        let waiting: u64 = rows.iter().map(|(_, n)| *n as u64).sum();
        s.samples += 1;
        s.waiting_sum += waiting;
        s.waiting_max = s.waiting_max.max(waiting);
        if waiting > 0 {
            s.samples_with_waiters += 1;
        }
        for (event, n) in rows {
            *s.by_event.entry(event).or_default() += n as u64;
        }
        tokio::time::sleep(Duration::from_millis(SAMPLE_EVERY_MS)).await;
    }
    conn.close().await?;
    Ok(s)
}

/// A started worker process, connected and waiting for `go`.
struct ReadyChild {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
}

async fn start_child(ctx: &Ctx, spec: &CaseSpec, db: &CaseDb, index: u32) -> anyhow::Result<ReadyChild> {
    let mut child = tokio::process::Command::new(&ctx.exe)
        .arg("bench-worker")
        .args(["--strategy", spec.strategy.name()])
        .args(["--period", &db.period.to_string()])
        .args(["--run", &db.run_id.to_string()])
        .args(["--chunk", &spec.chunk.to_string()])
        .args(["--work-ms", &spec.work_ms.to_string()])
        .args(["--index", &index.to_string()])
        .args(["--concurrency", &spec.concurrency.to_string()])
        .args(["--redis-url", &ctx.opts.redis_url])
        .args(["--lock-key", &format!("settled-bench:{}", db.name)])
        .env("DATABASE_URL", &db.url)
        .env(
            "SETTLED_LOG",
            std::env::var("SETTLED_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting a bench worker")?;
    let stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(READY_TIMEOUT_SECS), stdout.read_line(&mut line))
        .await
        .context("a bench worker did not get ready in time")??;
    anyhow::ensure!(
        line.trim() == "ready",
        "a bench worker did not start: {:?}",
        line.trim()
    );
    Ok(ReadyChild { child, stdin, stdout })
}

async fn run_strategy_case(ctx: &Ctx, spec: &CaseSpec) -> CaseResult {
    let mut case = CaseResult::new(
        "strategy",
        spec.strategy.name(),
        spec.workers,
        spec.work_ms,
        spec.creators,
    );
    case.chunk = Some(spec.chunk);
    case.concurrency = spec.concurrency;
    if let Err(err) = measure_strategy(ctx, spec, &mut case).await {
        case.error = Some(format!("{err:#}"));
    }
    case
}

async fn measure_strategy(ctx: &Ctx, spec: &CaseSpec, case: &mut CaseResult) -> anyhow::Result<()> {
    let db = prepare_case(ctx, spec.creators).await?;
    let measured = async {
        let cpu_before = client_cpu();
        let mut children = Vec::new();
        for index in 0..spec.workers {
            children.push(start_child(ctx, spec, &db, index).await?);
        }
        let mut admin = PgConnection::connect(&ctx.admin_url).await?;
        let before = transactions(&mut admin, &db.name).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = tokio::spawn(sample_locks(ctx.admin_url.clone(), db.name.clone(), stop.clone()));
        let started = Instant::now();
        let mut waits = Vec::new();
        for mut c in children {
            c.stdin.write_all(b"go\n").await?;
            c.stdin.flush().await?;
            waits.push(tokio::spawn(async move {
                let mut out = String::new();
                c.stdout.read_to_string(&mut out).await?;
                let status = c.child.wait().await?;
                let ended = Instant::now();
                drop(c.stdin);
                anyhow::ensure!(status.success(), "a bench worker failed ({status})");
                let last = out.lines().last().unwrap_or_default();
                let report: child::ChildReport =
                    serde_json::from_str(last).with_context(|| format!("a bench worker's report: {last:?}"))?;
                anyhow::Ok((report, ended))
            }));
        }
        let mut reports = Vec::new();
        let mut last_exit = started;
        let mut first_error = None;
        let deadline = tokio::time::Instant::from_std(started) + Duration::from_secs(CASE_TIMEOUT_SECS);
        for i in 0..waits.len() {
            match tokio::time::timeout_at(deadline, &mut waits[i]).await {
                Ok(joined) => match joined? {
                    Ok((report, ended)) => {
                        last_exit = last_exit.max(ended);
                        reports.push(report);
                    }
                    Err(err) => {
                        first_error.get_or_insert(err);
                    }
                },
                Err(_) => {
                    // Dropping the aborted tasks kills their processes.
                    for w in &waits {
                        w.abort();
                    }
                    stop.store(true, Ordering::Relaxed);
                    anyhow::bail!("the case did not finish within {CASE_TIMEOUT_SECS} s; its workers were killed");
                }
            }
        }
        let elapsed = last_exit - started;
        case.client_cpu_seconds = Some(client_cpu() - cpu_before);
        stop.store(true, Ordering::Relaxed);
        let locks = sampler.await??;
        if let Some(err) = first_error {
            return Err(err);
        }
        wait_disconnected(&mut admin, &db.name).await?;
        let after = transactions(&mut admin, &db.name).await?;
        admin.close().await?;
        case.record_time(elapsed);
        case.transactions_per_item = Some((after - before) as f64 / spec.creators as f64);
        let mut latency = child::new_histogram();
        for r in &reports {
            for &(value, count) in &r.latency_us {
                latency.record_n(value, count)?;
            }
        }
        case.claims = Some(latency.len());
        case.claim_p50_ms = Some(latency.value_at_quantile(0.5) as f64 / 1e3);
        case.claim_p99_ms = Some(latency.value_at_quantile(0.99) as f64 / 1e3);
        case.lock_waiting_avg = Some(locks.waiting_sum as f64 / locks.samples.max(1) as f64);
        case.lock_waiting_max = Some(locks.waiting_max);
        case.lock_wait_share = Some(locks.samples_with_waiters as f64 / locks.samples.max(1) as f64);
        case.lock_wait_events = locks.by_event;
        case.peak_rss_mib = reports.iter().map(|r| r.peak_rss_kib as f64 / 1024.0).reduce(f64::max);
        let settled: u64 = reports.iter().map(|r| r.settled).sum();
        case.extra.insert("settled_by_workers".into(), settled.into());
        case.extra.insert(
            "per_worker_settled".into(),
            reports.iter().map(|r| r.settled).collect::<Vec<_>>().into(),
        );
        if matches!(spec.strategy, Strategy::RedisLock | Strategy::AdvisoryLock) {
            let waited: f64 = reports.iter().map(|r| r.lock_wait_ms).sum();
            case.extra.insert("global_lock_wait_ms_total".into(), waited.into());
        }
        if matches!(spec.strategy, Strategy::Offset | Strategy::ForUpdate) {
            let locked: u64 = reports.iter().map(|r| r.rows_locked).sum();
            case.extra.insert("rows_locked".into(), locked.into());
            case.extra.insert(
                "rows_locked_per_item".into(),
                (locked as f64 / spec.creators as f64).into(),
            );
            case.extra.insert(
                "short_claims".into(),
                reports.iter().map(|r| r.short_claims).sum::<u64>().into(),
            );
        }
        if spec.strategy == Strategy::Offset {
            case.extra.insert(
                "offset_fallbacks".into(),
                reports.iter().map(|r| r.offset_fallbacks).sum::<u64>().into(),
            );
        }
        anyhow::Ok(())
    }
    .await;
    conclude(ctx, &db, measured, case).await
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
