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

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::PgPool;

use crate::provider_sim::{Arrival, Faults, Options};
use settled::db::Database;
use settled::period::Period;
use settled::progress::Progress;

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

/// One throughput run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ThroughputRun {
    /// Payouts in the backlog.
    pub payouts: u64,
    /// Seconds from the backlog's commit to the last payout leaving `queued`.
    pub seconds: f64,
    /// Payouts per second.
    pub per_sec: f64,
    /// Payouts per second as the provider saw their calls arrive (first to last).
    pub provider_per_sec: f64,
    /// CPU seconds the run took: the database server's processes, the
    /// deliverers, and the bench's own process (the simulator).
    pub cpu_postgres_secs: f64,
    /// The deliverers' CPU seconds.
    pub cpu_deliverers_secs: f64,
    /// The bench process's CPU seconds (the simulator, in it).
    pub cpu_simulator_secs: f64,
}

/// The wake-up latency, in milliseconds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Wakeup {
    /// Payouts measured.
    pub samples: usize,
    /// From the 201 to the provider call (a call that arrived before the
    /// client had read its 201 counts as 0).
    pub p50_ms: f64,
    /// Its 99th percentile.
    pub p99_ms: f64,
    /// Its largest.
    pub max_ms: f64,
    /// Calls that arrived before the client had read the 201.
    pub before_the_201: usize,
    /// From sending the request to the provider call, p50.
    pub from_request_p50_ms: f64,
    /// From sending the request to the provider call, p99.
    pub from_request_p99_ms: f64,
}

/// One serve run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServeRun {
    /// Seconds measured.
    pub seconds: f64,
    /// Payouts answered 201 per second.
    pub created_per_sec: f64,
    /// Payouts that left `queued` per second meanwhile.
    pub delivered_per_sec: f64,
    /// Payouts still queued when the clients stopped.
    pub queued_at_end: i64,
    /// Requests not answered 201.
    pub errors: u64,
}

/// What the bench measured.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PayoutBenchReport {
    /// When it started.
    pub started_at: String,
    /// PostgreSQL's version.
    pub server_version: String,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The 1-minute load average before and after.
    pub load_before: String,
    /// The 1-minute load average after.
    pub load_after: String,
    /// The options.
    pub options: PayoutBenchOptions,
    /// The throughput runs.
    pub throughput: Vec<ThroughputRun>,
    /// Their median payouts/s.
    pub throughput_median_per_sec: f64,
    /// The wake-up latency.
    pub wakeup: Wakeup,
    /// The serve runs.
    pub serve: Vec<ServeRun>,
    /// Their median 201s/s.
    pub serve_median_per_sec: f64,
    /// Jobs the deliverers snoozed (waiting on the limiter or the
    /// provider), from their exit lines.
    pub deliverer_lines: Vec<String>,
}

impl PayoutBenchReport {
    /// True when both targets are met.
    pub fn ok(&self) -> bool {
        self.throughput_median_per_sec >= TARGET_DELIVERED_PER_SEC && self.wakeup.p99_ms < TARGET_WAKEUP_P99_MS
    }

    /// The markdown rendering.
    pub fn markdown(&self) -> String {
        let o = &self.options;
        let mut out = format!(
            "## Payouts\n\n`{}`\n\n{} CPUs, load {} before and {} after; {}\n\n\
             {} deliverers (--concurrency {} --batch {} --provider-concurrency {}), provider latency {} ms\n\n",
            o.command,
            self.cpus,
            self.load_before,
            self.load_after,
            self.server_version,
            o.deliverers,
            o.concurrency,
            o.batch,
            o.provider_concurrency,
            o.provider_latency_ms
        );
        out.push_str(
            "| delivery run | payouts | seconds | payouts/s | at the provider/s | CPU s: PostgreSQL | deliverers | simulator |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        for (i, r) in self.throughput.iter().enumerate() {
            out.push_str(&format!(
                "| {} | {} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} |\n",
                i + 1,
                r.payouts,
                r.seconds,
                r.per_sec,
                r.provider_per_sec,
                r.cpu_postgres_secs,
                r.cpu_deliverers_secs,
                r.cpu_simulator_secs
            ));
        }
        let w = &self.wakeup;
        out.push_str(&format!(
            "\nmedian delivery: **{:.0} payouts/s** (target ≥ {:.0}: {})\n\n\
             idle wake-up, 201 → provider call, {} payouts: p50 {:.1} ms, **p99 {:.1} ms**, max {:.1} ms \
             ({} calls before the client read its 201; from the request: p50 {:.1} ms, p99 {:.1} ms) \
             (target p99 < {:.0} ms: {})\n\n",
            self.throughput_median_per_sec,
            TARGET_DELIVERED_PER_SEC,
            met(self.throughput_median_per_sec >= TARGET_DELIVERED_PER_SEC),
            w.samples,
            w.p50_ms,
            w.p99_ms,
            w.max_ms,
            w.before_the_201,
            w.from_request_p50_ms,
            w.from_request_p99_ms,
            TARGET_WAKEUP_P99_MS,
            met(w.p99_ms < TARGET_WAKEUP_P99_MS),
        ));
        out.push_str(&format!(
            "| serve run ({} servers, {} clients) | seconds | 201s/s | delivered/s | queued at the end | errors |\n\
             |---|---|---|---|---|---|\n",
            o.servers, o.clients
        ));
        for (i, r) in self.serve.iter().enumerate() {
            out.push_str(&format!(
                "| {} | {:.1} | {:.0} | {:.0} | {} | {} |\n",
                i + 1,
                r.seconds,
                r.created_per_sec,
                r.delivered_per_sec,
                r.queued_at_end,
                r.errors
            ));
        }
        out.push_str(&format!(
            "\nmedian through serve: **{:.0} payouts/s**\n\ndeliverers at exit:\n",
            self.serve_median_per_sec
        ));
        for line in &self.deliverer_lines {
            out.push_str(&format!("- {line}\n"));
        }
        out
    }
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

pub(super) fn unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Linux's clock ticks per second in `/proc/<pid>/stat` (USER_HZ).
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

/// A process's CPU time (user + system), in seconds; 0 when it is gone.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces): state is field 3,
    // utime and stime are fields 14 and 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / CLOCK_TICKS_PER_SEC
}

/// The parent of `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// CPU seconds so far of: the database server (its postmaster and the
/// processes it started), the deliverers, and this process.
struct CpuSnapshot {
    postgres: f64,
    deliverers: f64,
    simulator: f64,
}

fn cpu_snapshot(postmaster: Option<u32>, deliverers: &[u32]) -> CpuSnapshot {
    let postgres = postmaster.map_or(0.0, |pm| {
        let children: f64 = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| parent_of(*pid) == Some(pm))
            .map(cpu_secs)
            .sum();
        children + cpu_secs(pm)
    });
    CpuSnapshot {
        postgres,
        deliverers: deliverers.iter().map(|p| cpu_secs(*p)).sum(),
        simulator: cpu_secs(std::process::id()),
    }
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

/// The processes of the bench, stopped on drop.
struct Fleet {
    exe: PathBuf,
    url: String,
    deliverers: Vec<tokio::process::Child>,
    servers: Vec<(tokio::process::Child, String)>,
}

impl Fleet {
    fn deliver(&mut self, opts: &PayoutBenchOptions, provider: &str, log: &Path) -> anyhow::Result<()> {
        let child = tokio::process::Command::new(&self.exe)
            .args(["deliver", "--provider-url", provider])
            // The fleet's limiter far above what is offered: measured is delivery.
            .args(["--provider-rate", "1000000", "--provider-burst", "1000000"])
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args(["--batch", &opts.batch.to_string()])
            .args(["--provider-concurrency", &opts.provider_concurrency.to_string()])
            .args(["--provider-timeout-ms", "30000", "--shutdown-grace-ms", "5000"])
            .env("DATABASE_URL", &self.url)
            .env("SETTLED_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(log)?))
            .kill_on_drop(true)
            .spawn()?;
        self.deliverers.push(child);
        Ok(())
    }

    async fn serve(&mut self, log: &Path) -> anyhow::Result<String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let base = format!("http://127.0.0.1:{port}");
        let child = tokio::process::Command::new(&self.exe)
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &self.url)
            .env("SETTLED_API_TOKEN", API_TOKEN)
            .env("SETTLED_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(log)?))
            .kill_on_drop(true)
            .spawn()?;
        self.servers.push((child, base.clone()));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !reqwest::get(format!("{base}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            anyhow::ensure!(Instant::now() < deadline, "settled serve did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(base)
    }

    /// SIGTERM to the deliverers; their exit lines.
    async fn stop_deliverers(&mut self) -> Vec<String> {
        use tokio::io::AsyncReadExt;
        let mut lines = Vec::new();
        for child in &mut self.deliverers {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGTERM);
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                let _ = stdout.read_to_string(&mut out).await;
            }
            lines.push(out.trim().to_string());
        }
        lines
    }
}

async fn measure(opts: &PayoutBenchOptions, url: &str, scratch: &Path) -> anyhow::Result<PayoutBenchReport> {
    let load_before = load_average();
    let started_at = chrono::Utc::now().to_rfc3339();
    let exe = std::env::current_exe().context("locating the settled binary")?;
    let db = Database::open_url(url, 8, "settled-bench").await?;
    let server_version: String = sqlx::query_scalar("SELECT version()").fetch_one(&db.pool).await?;
    let creators = balances(&db.pool, &exe, url).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider = format!("http://{}", listener.local_addr()?);
    let faults = Faults {
        latency_ms: opts.provider_latency_ms,
        // Payments stay pending: the bench measures delivery, nothing after it.
        settle_delay_ms: 3_600_000,
        ..Faults::default()
    };
    let sim = tokio::spawn(crate::provider_sim::serve_with(
        listener,
        Options {
            faults,
            seed: super::BENCH_SEED,
            webhook: None,
        },
    ));
    let mut fleet = Fleet {
        exe,
        url: url.to_string(),
        deliverers: Vec::new(),
        servers: Vec::new(),
    };
    for i in 0..opts.deliverers {
        fleet.deliver(opts, &provider, &scratch.join(format!("deliver-{i}.log")))?;
    }
    wait_for_deliverers(&db.pool, opts.deliverers).await?;
    let postmaster = postmaster(&db.pool, opts.database_url.is_none()).await;
    let pids: Vec<u32> = fleet.deliverers.iter().filter_map(|c| c.id()).collect();
    let procs = (postmaster, pids.as_slice());
    eprintln!("bench: payouts: a warm-up backlog (not counted)");
    throughput_run(
        &db.pool,
        &provider,
        &creators,
        opts.backlog.min(2_000),
        "warm-up",
        procs,
    )
    .await?;
    let mut throughput = Vec::new();
    for run in 1..=opts.runs {
        let r = throughput_run(
            &db.pool,
            &provider,
            &creators,
            opts.backlog,
            &format!("run{run}"),
            procs,
        )
        .await?;
        eprintln!(
            "bench: payouts: delivery run {run}: {} payouts in {:.2} s, {:.0}/s",
            r.payouts, r.seconds, r.per_sec
        );
        throughput.push(r);
    }
    let first = fleet.serve(&scratch.join("serve-0.log")).await?;
    let wakeup = wakeup(&db.pool, &first, &provider, &creators, opts.latency_samples).await?;
    eprintln!(
        "bench: payouts: wake-up p50 {:.1} ms, p99 {:.1} ms",
        wakeup.p50_ms, wakeup.p99_ms
    );
    let mut bases = vec![first];
    for i in 1..opts.servers {
        bases.push(fleet.serve(&scratch.join(format!("serve-{i}.log"))).await?);
    }
    let mut serve = Vec::new();
    for run in 1..=opts.runs {
        let r = serve_run(&db.pool, &bases, &creators, opts, run).await?;
        eprintln!(
            "bench: payouts: serve run {run}: {:.0} created/s, {:.0} delivered/s",
            r.created_per_sec, r.delivered_per_sec
        );
        serve.push(r);
        drain(&db.pool, 60).await?;
    }
    let deliverer_lines = fleet.stop_deliverers().await;
    sim.abort();
    db.close().await?;
    Ok(PayoutBenchReport {
        started_at,
        server_version,
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        load_before,
        load_after: load_average(),
        options: opts.clone(),
        throughput_median_per_sec: median(throughput.iter().map(|r| r.per_sec).collect()),
        throughput,
        wakeup,
        serve_median_per_sec: median(serve.iter().map(|r| r.created_per_sec).collect()),
        serve,
        deliverer_lines,
    })
}

/// The postmaster's pid, when the bench runs the server on this machine.
async fn postmaster(pool: &PgPool, ours: bool) -> Option<u32> {
    if !ours {
        return None;
    }
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .ok()?;
    parent_of(backend as u32)
}

/// Seeds and settles `CREATORS` creators (`settled worker`); their names.
async fn balances(pool: &PgPool, exe: &Path, url: &str) -> anyhow::Result<Vec<String>> {
    let period = Period::from_date(chrono::Utc::now().date_naive() - chrono::Duration::days(1));
    settled::seed::seed(
        pool,
        period,
        CREATORS,
        super::BENCH_SEED,
        None,
        settled::seed::Volumes::Realistic,
        &Progress::hidden(),
    )
    .await?;
    crate::settle_in_a_worker(exe, url, &period.to_string()).await?;
    // Enough for every payout of one base unit the bench makes.
    let creators: Vec<String> = sqlx::query_scalar(
        "SELECT creator FROM settlement.creator_balance WHERE balance >= 1000000000 ORDER BY creator",
    )
    .fetch_all(pool)
    .await?;
    anyhow::ensure!(
        creators.len() >= 10,
        "too few creators with a balance: {}",
        creators.len()
    );
    Ok(creators)
}

/// Waits until every deliverer has its connections open.
async fn wait_for_deliverers(pool: &PgPool, n: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'settled-deliver' AND query ILIKE 'LISTEN%'",
        )
        .fetch_one(pool)
        .await?;
        if listening >= i64::from(n) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the deliverers did not start listening");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until no payout is queued, for at most `secs` seconds.
async fn drain(pool: &PgPool, secs: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement.payouts WHERE status = 'queued'")
            .fetch_one(pool)
            .await?;
        if queued == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{queued} payouts still queued after {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Commits `n` payouts of one base unit in one transaction, then times
/// their delivery.
async fn throughput_run(
    pool: &PgPool,
    provider: &str,
    creators: &[String],
    n: u64,
    tag: &str,
    procs: (Option<u32>, &[u32]),
) -> anyhow::Result<ThroughputRun> {
    let mut tx = pool.begin().await?;
    let first: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) + 1 FROM settlement.payouts")
        .fetch_one(&mut *tx)
        .await?;
    let made: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE d.outcome = 'paid')
         FROM generate_series(1, $1::bigint) AS i
         CROSS JOIN LATERAL settlement.debit_for_payout(
             ($3::text[])[1 + (i % array_length($3::text[], 1))], 1, 'bench-' || $2 || '-' || i, 'bench',
             NULL, NULL, NULL) AS d",
    )
    .bind(n as i64) // $1
    .bind(format!("{tag}-{}", uuid::Uuid::new_v4().simple())) // $2
    .bind(creators) // $3
    .fetch_one(&mut *tx)
    .await?;
    anyhow::ensure!(made == n as i64, "the backlog made {made} of {n} payouts");
    let applied_before = applied(provider).await?;
    let cpu_before = cpu_snapshot(procs.0, procs.1);
    tx.commit().await?;
    let committed: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await?;
    // Watched at the provider, not in the database: a count of queued
    // payouts every few milliseconds read the dead entries of the status
    // index each time, and that cost more than the delivery.
    let deadline = Instant::now() + Duration::from_secs(60 + n * DRAIN_SECS_PER_THOUSAND / 1_000);
    while applied(provider).await? < applied_before + n {
        anyhow::ensure!(Instant::now() < deadline, "the backlog was not delivered in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drain(pool, 60).await?;
    let cpu_after = cpu_snapshot(procs.0, procs.1);
    let last: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(at))::float8 FROM settlement.payout_history
         WHERE payout_id >= $1 AND from_state = 'queued'",
    )
    .bind(first) // $1
    .fetch_one(pool)
    .await?;
    let keys: std::collections::HashSet<String> =
        sqlx::query_scalar("SELECT provider_key FROM settlement.payouts WHERE id >= $1")
            .bind(first) // $1
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let times: Vec<i64> = arrivals(provider)
        .await?
        .into_iter()
        .filter(|a| keys.contains(&a.idempotency_key))
        .map(|a| a.arrived_us)
        .collect();
    let provider_secs = match (times.iter().min(), times.iter().max()) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
        _ => f64::NAN,
    };
    let seconds = (last - committed).max(1e-6);
    Ok(ThroughputRun {
        payouts: n,
        seconds,
        per_sec: n as f64 / seconds,
        provider_per_sec: times.len() as f64 / provider_secs,
        cpu_postgres_secs: cpu_after.postgres - cpu_before.postgres,
        cpu_deliverers_secs: cpu_after.deliverers - cpu_before.deliverers,
        cpu_simulator_secs: cpu_after.simulator - cpu_before.simulator,
    })
}

/// Payments the provider has applied so far.
async fn applied(provider: &str) -> anyhow::Result<u64> {
    let counters: crate::provider_sim::SimCounters = reqwest::get(format!("{provider}/v1/counters"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(counters.applied)
}

async fn arrivals(provider: &str) -> anyhow::Result<Vec<Arrival>> {
    Ok(reqwest::get(format!("{provider}/v1/arrivals"))
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// Payouts one at a time through `base`, the system idle in between; the
/// time from each 201 to its provider call.
async fn wakeup(
    pool: &PgPool,
    base: &str,
    provider: &str,
    creators: &[String],
    samples: u32,
) -> anyhow::Result<Wakeup> {
    drain(pool, 60).await?;
    let http = reqwest::Client::new();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut made = Vec::new();
    for i in 0..samples as usize {
        tokio::time::sleep(Duration::from_millis(IDLE_PAUSE_MS)).await;
        let sent_us = unix_us();
        let r = http
            .post(format!("{base}/v1/payouts"))
            .bearer_auth(API_TOKEN)
            .header("Idempotency-Key", format!("wake-{tag}-{i}"))
            .json(&serde_json::json!({ "creator": creators[i % creators.len()], "amount": "1" }))
            .send()
            .await?;
        let answered_us = unix_us();
        anyhow::ensure!(r.status() == 201, "a payout answered {}", r.status());
        let id = r.json::<serde_json::Value>().await?["id"]
            .as_i64()
            .context("a 201 without an id")?;
        made.push((id, sent_us, answered_us));
    }
    drain(pool, 60).await?;
    let ids: Vec<i64> = made.iter().map(|(id, ..)| *id).collect();
    let key_of: std::collections::HashMap<i64, String> =
        sqlx::query_as("SELECT id, provider_key FROM settlement.payouts WHERE id = ANY($1)")
            .bind(&ids) // $1
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let arrived: std::collections::HashMap<String, i64> = arrivals(provider)
        .await?
        .into_iter()
        .map(|a| (a.idempotency_key, a.arrived_us))
        .collect();
    let (mut from_201, mut from_request, mut before) = (Vec::new(), Vec::new(), 0);
    for (id, sent, answered) in &made {
        let key = key_of
            .get(id)
            .with_context(|| format!("payout {id} is not in the database"))?;
        let at = *arrived
            .get(key)
            .with_context(|| format!("the provider never got payout {id}"))?;
        before += usize::from(at < *answered);
        from_201.push(((at - answered) as f64 / 1e3).max(0.0));
        from_request.push((at - sent) as f64 / 1e3);
    }
    from_201.sort_by(f64::total_cmp);
    from_request.sort_by(f64::total_cmp);
    Ok(Wakeup {
        samples: made.len(),
        p50_ms: percentile(&from_201, 50.0),
        p99_ms: percentile(&from_201, 99.0),
        max_ms: from_201.last().copied().unwrap_or(0.0),
        before_the_201: before,
        from_request_p50_ms: percentile(&from_request, 50.0),
        from_request_p99_ms: percentile(&from_request, 99.0),
    })
}

/// `opts.clients` clients making payouts through `bases` for
/// `opts.serve_seconds`, delivery running.
async fn serve_run(
    pool: &PgPool,
    bases: &[String],
    creators: &[String],
    opts: &PayoutBenchOptions,
    run: u32,
) -> anyhow::Result<ServeRun> {
    let stop = Arc::new(AtomicBool::new(false));
    let (created, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let http = reqwest::Client::builder().pool_max_idle_per_host(1024).build()?;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let window_start: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..opts.clients as usize {
        let (stop, created, errors, http) = (stop.clone(), created.clone(), errors.clone(), http.clone());
        let base = bases[c % bases.len()].clone();
        let creators = creators.to_vec();
        let tag = format!("{tag}-{run}-{c}");
        clients.spawn(async move {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let r = http
                    .post(format!("{base}/v1/payouts"))
                    .bearer_auth(API_TOKEN)
                    .header("Idempotency-Key", format!("serve-{tag}-{i}"))
                    .json(&serde_json::json!({ "creator": creators[(c * 7919 + i) % creators.len()], "amount": "1" }))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 201 => created.fetch_add(1, Ordering::Relaxed),
                    _ => errors.fetch_add(1, Ordering::Relaxed),
                };
                i += 1;
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(opts.serve_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    while clients.join_next().await.is_some() {}
    let window_end = window_start + seconds;
    let (delivered, queued): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM settlement.payout_history
                 WHERE from_state = 'queued' AND at >= to_timestamp($1) AND at < to_timestamp($2)),
                (SELECT count(*) FROM settlement.payouts WHERE status = 'queued')",
    )
    .bind(window_start) // $1
    .bind(window_end) // $2
    .fetch_one(pool)
    .await?;
    Ok(ServeRun {
        seconds,
        created_per_sec: created.load(Ordering::Relaxed) as f64 / seconds,
        delivered_per_sec: delivered as f64 / seconds,
        queued_at_end: queued,
        errors: errors.load(Ordering::Relaxed),
    })
}
