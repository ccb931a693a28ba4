//! `settled chaos`: settle a period with several worker processes while a
//! seeded schedule injects faults (SIGKILL, SIGSTOP past the lease then
//! SIGCONT, terminated backends, a PostgreSQL restart, provider errors and
//! "applied, then timed out"), then prove the invariants. The same seed
//! replays the same schedule.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use settled_embedded::{LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};

use crate::provider_sim::Faults;
use settled::db::Database;
use settled::money::FeeBps;
use settled::period::Period;
use settled::progress::Progress;
use settled::provider::HttpProvider;
use settled::settlement::queue;
use settled::worker::Mode;
use settled::{seed, verify};

mod faults;
pub mod payouts;

use faults::{inject, Fleet, Targets, PROVIDER_FAULT_SECS};
pub use faults::{payout_schedule, schedule, FaultKind, ScheduledFault};
pub use payouts::{chaos_payouts, PayoutChaosOptions, PayoutCounts};

/// Largest number of worker processes a chaos run starts.
pub const MAX_CHAOS_WORKERS: u32 = 32;
/// Longest fault schedule, in seconds.
pub const MAX_CHAOS_SECONDS: u64 = 3_600;
/// How long the work may take to drain after the schedule ends.
pub const DRAIN_DEADLINE_SECS: u64 = 300;

/// What a chaos run does.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Creators to settle.
    pub creators: u64,
    /// Worker processes.
    pub workers: u32,
    /// Length of the fault schedule, in seconds.
    pub duration: u64,
    /// Seed of the schedule (and of the data and the provider's faults).
    pub seed: u64,
    /// Execution mode of the workers.
    pub mode: Mode,
    /// Claim loops per worker.
    pub concurrency: u32,
    /// Items per claim.
    pub chunk: u32,
    /// Lease ttl in milliseconds (leased mode).
    pub lease_ttl_ms: u64,
    /// An existing server to make a fresh database on (None: a private,
    /// throwaway server, which chaos may also restart).
    pub database_url: Option<String>,
}

/// What happened, for the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChaosReport {
    /// The options' seed.
    pub seed: u64,
    /// Faults as injected (or skipped, with why).
    pub injected: Vec<String>,
    /// Invariants with their results.
    pub invariants: Vec<(String, bool, String)>,
    /// True when every invariant holds.
    pub ok: bool,
    /// What the payout storm did (`--payouts` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payouts: Option<PayoutCounts>,
}

struct Slot {
    child: Option<tokio::process::Child>,
    stopped_until: Option<Instant>,
    /// The items (creator, attempt) this slot's worker held under lease
    /// when it was last paused as a zombie; taken by the loop.
    held_when_paused: Vec<(String, i32)>,
}

struct Harness {
    exe: PathBuf,
    url: String,
    period: Period,
    opts: ChaosOptions,
    work_ms: u64,
    provider_url: Option<String>,
    log_dir: PathBuf,
    spawned: usize,
}

impl Fleet for Harness {
    fn respawn(&mut self) -> anyhow::Result<tokio::process::Child> {
        self.spawn_worker()
    }

    fn application_name(&self) -> &'static str {
        "settled-worker"
    }
}

impl Harness {
    fn spawn_worker(&mut self) -> anyhow::Result<tokio::process::Child> {
        self.spawned += 1;
        let log = self.log_dir.join(format!("worker-{}.log", self.spawned));
        let mut cmd = crate::settled_command(&self.exe, &self.url, &log)?;
        cmd.args(["lab-worker", "--period", &self.period.to_string()])
            .args(["--concurrency", &self.opts.concurrency.to_string()])
            .args(["--chunk", &self.opts.chunk.to_string()])
            .args(["--work-ms", &self.work_ms.to_string()])
            .args(["--mode", if self.opts.mode == Mode::Leased { "leased" } else { "tx" }])
            .args(["--lease-ttl-ms", &self.opts.lease_ttl_ms.to_string()])
            .args([
                "--rescue-interval-ms",
                &(self.opts.lease_ttl_ms / 4).max(50).to_string(),
            ])
            .args([
                "--max-attempts",
                "50",
                "--backoff-base-ms",
                "50",
                "--backoff-cap-ms",
                "1000",
            ])
            .args(["--provider-timeout-ms", "500", "--shutdown-grace-ms", "2000"])
            .args(["--provider-concurrency", &in_flight_per_worker(&self.opts).to_string()]);
        if let Some(url) = &self.provider_url {
            cmd.args(["--provider-url", url]);
        }
        Ok(cmd.spawn()?)
    }
}

/// Seeds `creators` creators' volumes for `period` at the chaos runs' fee
/// (2.5 %).
async fn seed_at_fee(
    db: &Database,
    period: Period,
    creators: u64,
    rng_seed: u64,
    volumes: seed::Volumes,
) -> anyhow::Result<()> {
    let fee = FeeBps::new(250).map_err(anyhow::Error::msg)?;
    seed::seed(
        &db.pool,
        period,
        creators,
        rng_seed,
        Some(fee),
        volumes,
        &Progress::hidden(),
    )
    .await?;
    Ok(())
}

/// Runs a chaos pass and returns its report.
pub async fn chaos(opts: ChaosOptions) -> anyhow::Result<ChaosReport> {
    anyhow::ensure!(
        (1..=MAX_CHAOS_WORKERS).contains(&opts.workers),
        "--workers must be 1..={MAX_CHAOS_WORKERS}"
    );
    anyhow::ensure!(
        (1..=MAX_CHAOS_SECONDS).contains(&opts.duration),
        "--duration must be 1..={MAX_CHAOS_SECONDS}"
    );
    anyhow::ensure!(opts.creators >= 1, "--creators must be at least 1");
    let scratch = tempfile::Builder::new().prefix("settled-chaos-").tempdir()?;
    let place = ChaosDb::create(&opts.database_url, scratch.path()).await?;
    let result = run_chaos(&opts, &place.url, place.server.as_ref(), scratch.path()).await;
    place.finish(result, scratch).await
}

/// The fresh database a chaos run works on: on DATABASE_URL's server, or on
/// a private throwaway server that chaos may restart.
pub(crate) struct ChaosDb {
    pub(crate) server: Option<LocalPostgres>,
    admin_url: String,
    name: String,
    pub(crate) url: String,
}

impl ChaosDb {
    pub(crate) async fn create(database_url: &Option<String>, scratch: &std::path::Path) -> anyhow::Result<ChaosDb> {
        let (server, admin_url, name) = match database_url {
            Some(url) => (
                None,
                url.clone(),
                format!("settled_chaos_{}", uuid::Uuid::new_v4().simple()),
            ),
            None => {
                let local = LocalOptions {
                    data_dir: scratch.join("pg"),
                    throwaway: true,
                    remove_on_stop: true,
                    max_connections: 300,
                    settings: Vec::new(),
                };
                let server = tokio::task::spawn_blocking(move || LocalPostgres::start(&local)).await??;
                let url = server.url("postgres");
                (Some(server), url, "settled_chaos".to_string())
            }
        };
        let mut admin = PgConnection::connect(&admin_url)
            .await
            .context("connecting to the chaos server")?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let url = settled_embedded::with_database(&admin_url, &name);
        Ok(ChaosDb {
            server,
            admin_url,
            name,
            url,
        })
    }

    /// Drops the database and stops the private server; on a failed run
    /// prints the state and keeps the processes' logs in `scratch`.
    pub(crate) async fn finish(
        self,
        result: anyhow::Result<ChaosReport>,
        scratch: tempfile::TempDir,
    ) -> anyhow::Result<ChaosReport> {
        let failed = !matches!(&result, Ok(report) if report.ok);
        if failed {
            // Keep what explains the failure: the processes' logs, and the state.
            eprintln!("{}", diagnose(&self.url).await);
        }
        if let Ok(mut admin) = PgConnection::connect(&self.admin_url).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name))
                .execute(&mut admin)
                .await;
        }
        if let Some(server) = self.server {
            tokio::task::spawn_blocking(move || server.stop()).await??;
        }
        if failed {
            let kept = scratch.keep();
            eprintln!("chaos: process logs kept in {}", kept.display());
        }
        result
    }
}

/// The statements a failed chaos run shows the database's state with. They
/// run only after a failure, so a test runs each on the current schema
/// (`crates/cli/tests/e2e/chaos.rs`): a stale column here would go unseen.
pub const DIAGNOSIS_QUERIES: &[&str] = &[
    "SELECT status || ': ' || count(*) FROM settlement.token_trade_volume GROUP BY status",
    "SELECT 'processing ' || creator || ' attempt ' || attempt || ' owner ' || coalesce(lease_owner::text, '-')
                || ' expires in ' || coalesce(round(extract(epoch FROM lease_until - now()))::text, '-') || ' s'
         FROM settlement.token_trade_volume WHERE status = 'processing' ORDER BY lease_until LIMIT 10",
    "SELECT 'eligible, waiting until ' || not_before::text || ': ' || count(*) FROM settlement.token_trade_volume
         WHERE status = 'eligible' AND not_before > now() GROUP BY not_before ORDER BY not_before DESC LIMIT 5",
    "SELECT 'run ' || id || ' ' || scope || ' ' || state FROM settled_engine.runs",
    "SELECT 'worker ' || pid || ' ' || coalesce(ended, 'alive') || ' heartbeat ' || heartbeat_at::text
                || ' settled ' || items_settled FROM settled_engine.workers ORDER BY started_at",
    "SELECT 'payouts ' || status || ': ' || count(*) FROM settlement.payouts GROUP BY status",
    "SELECT 'payout ' || id || ' ' || status || ' since ' || updated_at::text || ' ' || coalesce(reason, '')
         FROM settlement.payouts WHERE status IN ('created', 'queued', 'sent') ORDER BY updated_at LIMIT 10",
    "SELECT 'delivery job ' || payout_id || ' ' || status || ' attempt ' || attempt || ' ' || coalesce(last_error, '')
         FROM settlement.payout_jobs WHERE status IN ('eligible', 'processing', 'failed') ORDER BY payout_id LIMIT 10",
    "SELECT 'backend ' || pid || ' ' || coalesce(application_name, '') || ' ' || coalesce(state, '') || ' '
                || coalesce(wait_event, '') || ' ' || left(query, 80)
         FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
];

/// What the database looks like, for a failed chaos run.
async fn diagnose(url: &str) -> String {
    let Ok(mut conn) = PgConnection::connect(url).await else {
        return "chaos: could not connect to diagnose".into();
    };
    let mut out = String::from("chaos: state at failure\n");
    for q in DIAGNOSIS_QUERIES {
        match sqlx::query_scalar::<_, String>(q).fetch_all(&mut conn).await {
            Ok(rows) => rows.iter().for_each(|r| out.push_str(&format!("  {r}\n"))),
            Err(e) => out.push_str(&format!("  ({e})\n")),
        }
    }
    out
}

async fn run_chaos(
    opts: &ChaosOptions,
    url: &str,
    server: Option<&LocalPostgres>,
    scratch: &std::path::Path,
) -> anyhow::Result<ChaosReport> {
    let db = Database::open_url(url, 4, "settled-chaos").await?;
    let period = Period::parse("2026-11-28").map_err(anyhow::Error::msg)?;
    eprintln!("chaos: seeding {} creators", opts.creators);
    seed_at_fee(&db, period, opts.creators, opts.seed, seed::Volumes::Extreme).await?;

    // Provider simulator, in this process, in leased mode.
    let (provider_url, sim_task) = if opts.mode == Mode::Leased {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(crate::provider_sim::serve(listener, Faults::default(), opts.seed));
        (Some(url), Some(task))
    } else {
        (None, None)
    };
    let http = reqwest::Client::new();

    let duration = Duration::from_secs(opts.duration);
    // Spread the work over the schedule: total work / items worked at once
    // ~ 80% of it. In leased mode a chunk's items are worked concurrently,
    // up to --provider-concurrency per worker (here four per claim loop).
    let loops = u64::from(opts.workers) * u64::from(in_flight_per_worker(opts));
    let work_ms = (duration.as_millis() as u64 * loops * 8 / 10 / opts.creators).clamp(1, 200);
    let faults = schedule(opts.seed, duration, opts.workers, opts.mode, server.is_some());
    let mut harness = Harness {
        exe: std::env::current_exe()?,
        url: url.to_string(),
        period,
        opts: opts.clone(),
        work_ms,
        provider_url: provider_url.clone(),
        log_dir: scratch.to_path_buf(),
        spawned: 0,
    };
    eprintln!(
        "chaos: {} workers x {} loops, {} ms of work per item, {} faults over {} s (seed {})",
        opts.workers,
        opts.concurrency,
        work_ms,
        faults.len(),
        opts.duration,
        opts.seed
    );
    let mut slots: Vec<Slot> = Vec::new();
    for _ in 0..opts.workers {
        slots.push(Slot {
            child: Some(harness.spawn_worker()?),
            stopped_until: None,
            held_when_paused: Vec::new(),
        });
    }

    let started = Instant::now();
    let mut injected = Vec::new();
    let mut zombies = 0u32;
    let mut zombie_items: Vec<(String, i32)> = Vec::new();
    let mut pending = faults.into_iter().peekable();
    let ttl = Duration::from_millis(opts.lease_ttl_ms);
    let zombie_pause = ttl * 2 + Duration::from_millis(opts.lease_ttl_ms / 2) + Duration::from_secs(1);
    let drain_deadline = duration + Duration::from_secs(DRAIN_DEADLINE_SECS);
    let mut provider_reset_at: Option<Instant> = None;
    let mut conn = db.pool.acquire().await?.detach();
    let bar = Progress::new("chaos", opts.creators);
    loop {
        let now = started.elapsed();
        // Faults due now.
        while pending.peek().is_some_and(|f| Duration::from_millis(f.at_ms) <= now) {
            let fault = pending.next().expect("peeked");
            let targets = Targets {
                server,
                url,
                provider_url: provider_url.as_deref(),
                provider_base: Faults::default(),
                zombie_pause,
                provider_fault_secs: PROVIDER_FAULT_SECS,
            };
            let line = inject(&fault, &mut slots, &mut harness, &targets, &mut conn, &http)
                .await
                .unwrap_or_else(|e| format!("{:>6.1}s {:?}: failed to inject: {e:#}", now.as_secs_f64(), fault.kind));
            let held = std::mem::take(&mut slots[fault.slot].held_when_paused);
            if fault.kind == FaultKind::ZombieWorker && !held.is_empty() {
                zombies += 1;
                zombie_items.extend(held);
            }
            if matches!(
                fault.kind,
                FaultKind::ProviderErrors | FaultKind::ProviderAppliedTimeout
            ) {
                provider_reset_at = Some(Instant::now() + Duration::from_secs(PROVIDER_FAULT_SECS));
            }
            bar.println(&format!("chaos: {line}"));
            injected.push(line);
        }
        if provider_reset_at.is_some_and(|t| Instant::now() >= t) {
            provider_reset_at = None;
            if let Some(p) = &provider_url {
                http.post(format!("{p}/v1/faults"))
                    .json(&Faults::default())
                    .send()
                    .await?;
            }
        }
        // Zombies wake up once their leases are surely gone.
        for slot in slots.iter_mut() {
            if slot.stopped_until.is_some_and(|t| Instant::now() >= t) {
                slot.stopped_until = None;
                if let Some(child) = &slot.child {
                    if let Some(pid) = child.id() {
                        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
                    }
                }
            }
        }
        // Workers that ended: replaced while work remains.
        let left = match queue().count_unfinished(&mut conn, &period.to_string()).await {
            Ok(n) => n,
            Err(_) => {
                // The server may be restarting: reconnect and look again.
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(c) = db.pool.acquire().await {
                    conn = c.detach();
                }
                continue;
            }
        };
        bar.set(opts.creators.saturating_sub(left.max(0) as u64));
        let mut running = 0;
        for slot in slots.iter_mut() {
            if let Some(child) = &mut slot.child {
                match child.try_wait()? {
                    None => running += 1,
                    // A worker that could not start (2) or panicked (101) is
                    // a bug, not a fault: respawning it would loop forever.
                    Some(status) if matches!(status.code(), Some(2) | Some(101)) => anyhow::bail!(
                        "a worker could not run ({status}); worker logs are in {}",
                        scratch.display()
                    ),
                    Some(_) => slot.child = None,
                }
            }
            if slot.child.is_none() && left > 0 {
                slot.child = Some(harness.spawn_worker()?);
                running += 1;
            }
        }
        if left == 0 && running == 0 && pending.peek().is_none() {
            break;
        }
        if started.elapsed() > drain_deadline {
            anyhow::bail!(
                "work did not drain within {} s; worker logs are in {}",
                drain_deadline.as_secs(),
                scratch.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "chaos: drained after {:.1} s; checking invariants",
        started.elapsed().as_secs_f64()
    );

    // The invariants.
    let mut report = verify::verify(&mut conn, period).await?;
    if let Some(p) = &provider_url {
        let provider = HttpProvider::new(p, Duration::from_secs(60))?;
        verify::reconcile_provider(&mut conn, period, &provider, &mut report).await?;
    }
    let mut invariants = invariants_of(&report);
    let (settled, failed, failed_without_reason): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'settled'), count(*) FILTER (WHERE status = 'failed'),
                count(*) FILTER (WHERE status = 'failed' AND coalesce(last_error, '') = '')
         FROM settlement.token_trade_volume WHERE period = $1",
    )
    .bind(period.date())
    .fetch_one(&mut conn)
    .await?;
    invariants.push((
        "every_creator_settled_or_failed_with_reason".into(),
        settled + failed == opts.creators as i64 && failed_without_reason == 0,
        format!(
            "{settled} settled, {failed} failed ({failed_without_reason} without a reason) of {}",
            opts.creators
        ),
    ));
    let rejections: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(fence_rejections), 0)::bigint FROM settled_engine.workers")
            .fetch_one(&mut conn)
            .await?;
    if opts.mode == Mode::Leased {
        // Every item a zombie held when paused ended once (the ledger and
        // provider checks above prove once): finished by the zombie under
        // its own fence when nobody claimed it meanwhile, or under a later
        // attempt, the zombie's late completion refused by the fence or
        // abandoned when it saw its lease gone.
        let (keys, attempts): (Vec<String>, Vec<i32>) = zombie_items.iter().cloned().unzip();
        let (finished, taken_over): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE t.status IN ('settled', 'failed')),
                    count(*) FILTER (WHERE t.status IN ('settled', 'failed') AND t.attempt > z.attempt)
             FROM unnest($2::text[], $3::int[]) AS z(creator, attempt)
             JOIN settlement.token_trade_volume t ON t.period = $1 AND t.creator = z.creator",
        )
        .bind(period.date()) // $1
        .bind(&keys) // $2
        .bind(&attempts) // $3
        .fetch_one(&mut conn)
        .await?;
        invariants.push((
            "zombie_items_finished_once".into(),
            finished == zombie_items.len() as i64,
            format!(
                "{finished} of the {} item(s) {zombies} zombie pause(s) held ended, {taken_over} of them under a later attempt; \
                 {rejections} late completion(s) refused by the fence",
                zombie_items.len()
            ),
        ));
    }
    if let Some(p) = &provider_url {
        let counters: serde_json::Value = http.get(format!("{p}/v1/counters")).send().await?.json().await?;
        injected.push(format!("provider counters: {counters}"));
    }
    let ok = invariants.iter().all(|(_, ok, _)| *ok);
    for slot in slots.iter_mut() {
        if let Some(mut child) = slot.child.take() {
            let _ = child.kill().await;
        }
    }
    if let Some(task) = sim_task {
        task.abort();
    }
    db.close().await?;
    Ok(ChaosReport {
        seed: opts.seed,
        injected,
        invariants,
        ok,
        payouts: None,
    })
}

impl ChaosReport {
    /// The human rendering.
    pub fn render(&self) -> String {
        let mut out = format!("\nchaos report (seed {})\nfaults injected:\n", self.seed);
        for line in &self.injected {
            out.push_str(&format!("  {line}\n"));
        }
        if let Some(counts) = &self.payouts {
            out.push_str(&counts.render());
        }
        out.push_str("invariants:\n");
        for (name, ok, detail) in &self.invariants {
            out.push_str(&format!("  [{}] {name}: {detail}\n", if *ok { "ok" } else { "FAIL" }));
        }
        out.push_str(if self.ok {
            "result: every invariant holds\n"
        } else {
            "result: FAILED\n"
        });
        out
    }
}

/// Items a chaos worker works at once: one per claim loop in tx mode; in
/// leased mode four per loop (at most a chunk), so the concurrent calls of a
/// chunk are under the faults too.
fn in_flight_per_worker(opts: &ChaosOptions) -> u32 {
    match opts.mode {
        Mode::Leased => (opts.concurrency * 4).min(opts.concurrency * opts.chunk).max(1),
        _ => opts.concurrency,
    }
}

/// Verify's checks as invariants: name, whether it holds, and what it
/// proves (with its offenders when it does not).
fn invariants_of(report: &settled::verify::VerifyReport) -> Vec<(String, bool, String)> {
    report
        .checks
        .iter()
        .map(|c| {
            let detail = if c.ok {
                c.description.to_string()
            } else {
                format!("{}: {}", c.description, c.offenders.join("; "))
            };
            (c.name.to_string(), c.ok, detail)
        })
        .collect()
}
