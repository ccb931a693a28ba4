//! `settled chaos`: settle a period with several worker processes while a
//! seeded schedule injects faults (SIGKILL, SIGSTOP past the lease then
//! SIGCONT, terminated backends, a PostgreSQL restart, provider errors and
//! "applied, then timed out"), then prove the invariants. The same seed
//! replays the same schedule.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
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

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL a worker, then start a new one in its place.
    KillWorker,
    /// SIGSTOP a worker until its leases expired and were rescued, then SIGCONT.
    ZombieWorker,
    /// `pg_terminate_backend` on worker connections.
    TerminateBackends,
    /// Restart PostgreSQL (only when chaos runs the server).
    RestartPostgres,
    /// The provider answers 503 to a share of new payments for a while.
    ProviderErrors,
    /// The provider applies a share of new payments and answers too late.
    ProviderAppliedTimeout,
}

/// A fault at a time.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduledFault {
    /// Milliseconds after the workers start.
    pub at_ms: u64,
    /// What.
    pub kind: FaultKind,
    /// Which worker slot (for worker faults).
    pub slot: usize,
}

/// The seeded schedule: at least one fault of each kind the setup allows,
/// then more at random, at random times within the first 80% of the run.
pub fn schedule(seed: u64, duration: Duration, workers: u32, mode: Mode, can_restart: bool) -> Vec<ScheduledFault> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut kinds = vec![
        FaultKind::KillWorker,
        FaultKind::ZombieWorker,
        FaultKind::TerminateBackends,
    ];
    if can_restart {
        kinds.push(FaultKind::RestartPostgres);
    }
    if mode == Mode::Leased {
        kinds.extend([FaultKind::ProviderErrors, FaultKind::ProviderAppliedTimeout]);
    }
    let span = (duration.as_millis() as u64).max(1_000);
    let extra = (span / 6_000) as usize;
    for _ in 0..extra {
        // Extra faults: mostly kills, zombies and terminated connections.
        let pick = [
            FaultKind::KillWorker,
            FaultKind::ZombieWorker,
            FaultKind::TerminateBackends,
        ];
        kinds.push(pick[rng.gen_range(0..pick.len())]);
    }
    let mut faults: Vec<ScheduledFault> = kinds
        .into_iter()
        .map(|kind| ScheduledFault {
            at_ms: rng.gen_range(span / 10..=span * 8 / 10),
            kind,
            slot: rng.gen_range(0..workers as usize),
        })
        .collect();
    faults.sort_by_key(|f| f.at_ms);
    faults
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
}

struct Slot {
    child: Option<tokio::process::Child>,
    stopped_until: Option<Instant>,
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

impl Harness {
    fn spawn_worker(&mut self) -> anyhow::Result<tokio::process::Child> {
        self.spawned += 1;
        let log = std::fs::File::create(self.log_dir.join(format!("worker-{}.log", self.spawned)))?;
        let mut cmd = tokio::process::Command::new(&self.exe);
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
            .env("DATABASE_URL", &self.url)
            .env("SETTLED_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if let Some(url) = &self.provider_url {
            cmd.args(["--provider-url", url]);
        }
        Ok(cmd.spawn()?)
    }
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

    // A fresh database of its own.
    let (server, admin_url, db_name) = match &opts.database_url {
        Some(url) => (
            None,
            url.clone(),
            format!("settled_chaos_{}", uuid::Uuid::new_v4().simple()),
        ),
        None => {
            let local = LocalOptions {
                data_dir: scratch.path().join("pg"),
                throwaway: true,
                remove_on_stop: true,
                max_connections: 300,
            };
            let server = tokio::task::spawn_blocking(move || LocalPostgres::start(&local)).await??;
            let url = server.url("postgres");
            (Some(server), url, "settled_chaos".to_string())
        }
    };
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .context("connecting to the chaos server")?;
    sqlx::query(&format!("CREATE DATABASE {db_name}"))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    let url = settled_embedded::with_database(&admin_url, &db_name);
    let result = run_chaos(&opts, &url, server.as_ref(), scratch.path()).await;
    let failed = !matches!(&result, Ok(report) if report.ok);
    if failed {
        // Keep what explains the failure: the workers' logs, and the state.
        eprintln!("{}", diagnose(&url).await);
    }

    if let Ok(mut admin) = PgConnection::connect(&admin_url).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
    }
    if let Some(server) = server {
        tokio::task::spawn_blocking(move || server.stop()).await??;
    }
    if failed {
        let kept = scratch.keep();
        eprintln!("chaos: worker logs kept in {}", kept.display());
    }
    result
}

/// What the database looks like, for a failed chaos run.
async fn diagnose(url: &str) -> String {
    let Ok(mut conn) = PgConnection::connect(url).await else {
        return "chaos: could not connect to diagnose".into();
    };
    let mut out = String::from("chaos: state at failure\n");
    let queries = [
        "SELECT status || ': ' || count(*) FROM settlement.token_trade_volume GROUP BY status",
        "SELECT 'processing ' || creator || ' attempt ' || attempt || ' owner ' || coalesce(lease_owner::text, '-')
                || ' expires in ' || coalesce(round(extract(epoch FROM lease_until - now()))::text, '-') || ' s'
         FROM settlement.token_trade_volume WHERE status = 'processing' ORDER BY lease_until LIMIT 10",
        "SELECT 'eligible, waiting until ' || not_before::text || ': ' || count(*) FROM settlement.token_trade_volume
         WHERE status = 'eligible' AND not_before > now() GROUP BY not_before ORDER BY not_before DESC LIMIT 5",
        "SELECT 'run ' || id || ' ' || period || ' ' || state FROM settled_engine.runs",
        "SELECT 'worker ' || pid || ' ' || coalesce(ended, 'alive') || ' heartbeat ' || heartbeat_at::text
                || ' settled ' || items_settled FROM settled_engine.workers ORDER BY started_at",
        "SELECT 'backend ' || pid || ' ' || coalesce(application_name, '') || ' ' || coalesce(state, '') || ' '
                || coalesce(wait_event, '') || ' ' || left(query, 80)
         FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    ];
    for q in queries {
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
    seed::seed(
        &db.pool,
        period,
        opts.creators,
        opts.seed,
        Some(FeeBps::new(250).map_err(anyhow::Error::msg)?),
        &Progress::hidden(),
    )
    .await?;

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
    // Spread the work over the schedule: total work / parallel loops ~ 80% of it.
    let loops = u64::from(opts.workers * opts.concurrency);
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
        });
    }

    let started = Instant::now();
    let mut injected = Vec::new();
    let mut zombies = 0u32;
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
            let line = inject(
                &fault,
                &mut slots,
                &mut harness,
                server,
                &mut conn,
                url,
                &http,
                provider_url.as_deref(),
                zombie_pause,
            )
            .await
            .unwrap_or_else(|e| format!("{:>6.1}s {:?}: failed to inject: {e:#}", now.as_secs_f64(), fault.kind));
            if fault.kind == FaultKind::ZombieWorker && line.contains("SIGSTOP") {
                zombies += 1;
            }
            if matches!(
                fault.kind,
                FaultKind::ProviderErrors | FaultKind::ProviderAppliedTimeout
            ) {
                provider_reset_at = Some(Instant::now() + Duration::from_secs(3));
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
    let mut invariants: Vec<(String, bool, String)> = report
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
        .collect();
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
        invariants.push((
            "zombie_completions_rejected".into(),
            zombies == 0 || rejections > 0,
            format!("{rejections} completions refused by the fence after {zombies} zombie pause(s)"),
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
    })
}

#[allow(clippy::too_many_arguments)]
async fn inject(
    fault: &ScheduledFault,
    slots: &mut [Slot],
    harness: &mut Harness,
    server: Option<&LocalPostgres>,
    conn: &mut PgConnection,
    url: &str,
    http: &reqwest::Client,
    provider_url: Option<&str>,
    zombie_pause: Duration,
) -> anyhow::Result<String> {
    let at = format!("{:>6.1}s", fault.at_ms as f64 / 1000.0);
    let slot = &mut slots[fault.slot];
    let pid = slot.child.as_ref().and_then(|c| c.id());
    Ok(match fault.kind {
        FaultKind::KillWorker => match pid {
            Some(pid) if slot.stopped_until.is_none() => {
                kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
                if let Some(mut child) = slot.child.take() {
                    let _ = child.wait().await;
                }
                slot.child = Some(harness.spawn_worker()?);
                format!("{at} SIGKILL worker slot {} (pid {pid}); started a new one", fault.slot)
            }
            _ => format!("{at} SIGKILL skipped: slot {} is paused or empty", fault.slot),
        },
        FaultKind::ZombieWorker => match pid {
            Some(pid) if slot.stopped_until.is_none() => {
                kill(Pid::from_raw(pid as i32), Signal::SIGSTOP)?;
                slot.stopped_until = Some(Instant::now() + zombie_pause);
                format!(
                    "{at} SIGSTOP worker slot {} (pid {pid}) for {:.1} s (past its lease), then SIGCONT",
                    fault.slot,
                    zombie_pause.as_secs_f64()
                )
            }
            _ => format!("{at} zombie skipped: slot {} is paused or empty", fault.slot),
        },
        FaultKind::TerminateBackends => {
            let killed: Vec<i32> = sqlx::query_scalar(
                "WITH victims AS MATERIALIZED (
                     SELECT pid FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'settled-worker'
                       AND pid <> pg_backend_pid())
                 SELECT pid FROM victims WHERE pg_terminate_backend(pid)",
            )
            .fetch_all(&mut *conn)
            .await?;
            format!("{at} pg_terminate_backend on {} worker connection(s)", killed.len())
        }
        FaultKind::RestartPostgres => match server {
            Some(server) => {
                let t = Instant::now();
                tokio::task::block_in_place(|| server.restart())?;
                *conn = PgConnection::connect(url).await?;
                format!("{at} restarted PostgreSQL ({:.1} s)", t.elapsed().as_secs_f64())
            }
            None => format!("{at} PostgreSQL restart skipped: the server is not managed by chaos (DATABASE_URL)"),
        },
        FaultKind::ProviderErrors | FaultKind::ProviderAppliedTimeout => {
            let Some(p) = provider_url else {
                return Ok(format!("{at} provider fault skipped: no provider in tx mode"));
            };
            let faults = if fault.kind == FaultKind::ProviderErrors {
                Faults {
                    error_rate: 0.3,
                    ..Faults::default()
                }
            } else {
                Faults {
                    applied_timeout_rate: 0.3,
                    applied_timeout_ms: 1_500,
                    ..Faults::default()
                }
            };
            http.post(format!("{p}/v1/faults"))
                .json(&faults)
                .send()
                .await?
                .error_for_status()?;
            format!(
                "{at} provider {} for 3 s",
                if fault.kind == FaultKind::ProviderErrors {
                    "answers 503 to 30% of new payments"
                } else {
                    "applies 30% of new payments, then answers after the caller's timeout"
                }
            )
        }
    })
}

impl ChaosReport {
    /// The human rendering.
    pub fn render(&self) -> String {
        let mut out = format!("\nchaos report (seed {})\nfaults injected:\n", self.seed);
        for line in &self.injected {
            out.push_str(&format!("  {line}\n"));
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
