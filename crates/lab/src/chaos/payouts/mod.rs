//! `settled chaos --payouts`: a payout storm under faults, then proof that
//! every payout was paid once or returned once.
//!
//! On a fresh database with settled balances: `--servers` `settled serve`
//! processes take payouts from `--clients` concurrent clients whose
//! idempotency keys repeat (a repeat often arrives while the first is in
//! progress), some waiting for a confirmation that two requests then race
//! (two confirmations, or a confirmation and a cancel) and some left to
//! expire. `--workers` `settled deliver` processes pay them through the
//! provider simulator, which fails a share of payments, refuses a share of
//! keys, returns a share of paid payments a moment later (their banks send
//! them back), forgets every key a few seconds after its first use (the
//! deliverers are told a shorter key window), and sends its webhooks
//! duplicated, held back and lost, to one server then the other. A seeded schedule SIGKILLs deliverers (a new one
//! takes the slot), SIGSTOPs them past their leases, terminates their
//! connections, restarts PostgreSQL once (when chaos runs it), and makes
//! the provider answer 503s, 429s, and late applies (applied, the answer
//! lost to the caller's timeout). Once the faults stopped and everything
//! drained (bounded), the checks in `checks.rs` run beside `verify`.

mod checks;
mod clients;
mod statements;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use settled_embedded::LocalPostgres;
use sqlx::{Connection, PgConnection};

pub use checks::PayoutCounts;

use super::faults::{inject, payout_schedule, provider_fault, FaultKind, Fleet, Targets};
use super::{invariants_of, ChaosDb, ChaosReport, Slot, MAX_CHAOS_SECONDS, MAX_CHAOS_WORKERS};
use crate::provider_sim::{Faults, Options, SimCounters, WebhookEndpoint};
use clients::{Plan, Storm, API_TOKEN};
use settled::db::Database;
use settled::money::FeeBps;
use settled::period::Period;
use settled::progress::Progress;
use settled::provider::HttpProvider;
use settled::{seed, verify};

/// Most concurrent clients.
pub const MAX_CHAOS_CLIENTS: u32 = 512;
/// Most `settled serve` processes.
pub const MAX_CHAOS_SERVERS: u32 = 8;
/// Most payout requests of one run.
pub const MAX_CHAOS_REQUESTS: u64 = 1_000_000;
/// How long the storm may take to drain after the schedule ends.
pub const PAYOUT_DRAIN_DEADLINE_SECS: u64 = 240;
/// How long a payout made with `confirm: true` waits (short, so some expire).
const CONFIRM_TTL_SECS: u64 = 4;
/// The secret the simulator signs webhooks with.
const WEBHOOK_SECRET: &str = "chaos-webhook-secret";
/// How long each provider fault lasts (they add up when they overlap).
const PROVIDER_FAULT_SECS: u64 = 5;
/// The period whose settlement gives the creators their balances.
const PERIOD: &str = "2026-11-28";

/// What a payout storm does.
#[derive(Debug, Clone)]
pub struct PayoutChaosOptions {
    /// Creators with balances to pay out from.
    pub creators: u64,
    /// Payout requests (distinct idempotency keys).
    pub requests: u64,
    /// Concurrent clients.
    pub clients: u32,
    /// `settled serve` processes.
    pub servers: u32,
    /// `settled deliver` processes.
    pub deliverers: u32,
    /// Length of the fault schedule, in seconds (the requests are spread
    /// over its first 70%).
    pub duration: u64,
    /// Seed of the schedule, the requests and the provider's choices.
    pub seed: u64,
    /// The deliverers' lease ttl in milliseconds.
    pub lease_ttl_ms: u64,
    /// An existing server to make a fresh database on (None: a private,
    /// throwaway server, which chaos restarts once).
    pub database_url: Option<String>,
}

impl PayoutChaosOptions {
    fn check(&self) -> anyhow::Result<()> {
        let within = |what: &str, n: u64, max: u64| {
            anyhow::ensure!((1..=max).contains(&n), "{what} must be 1..={max}, got {n}");
            Ok(())
        };
        within("--workers", u64::from(self.deliverers), u64::from(MAX_CHAOS_WORKERS))?;
        within("--clients", u64::from(self.clients), u64::from(MAX_CHAOS_CLIENTS))?;
        within("--servers", u64::from(self.servers), u64::from(MAX_CHAOS_SERVERS))?;
        within("--requests", self.requests, MAX_CHAOS_REQUESTS)?;
        within("--duration", self.duration, MAX_CHAOS_SECONDS)?;
        within("--creators", self.creators, settled::seed::MAX_SEED_CREATORS)
    }
}

/// How long after its first use the simulator forgets a key.
const PROVIDER_FORGETS_KEYS_MS: u64 = 6_000;
/// The key window the deliverers are told: shorter than the provider's.
const DELIVERERS_KEY_WINDOW: &str = "4s";
/// Time from a payment's paid to its return.
const RETURN_DELAY_MS: u64 = 300;

/// What the provider does all along: pays after a moment, fails a tenth,
/// refuses a twentieth of the keys, returns a tenth of the paid ones,
/// forgets keys after a few seconds; webhooks duplicated, held back, lost.
fn provider_base() -> Faults {
    Faults {
        settle_delay_ms: 200,
        failure_rate: 0.1,
        refusal_rate: 0.05,
        return_rate: 0.1,
        return_delay_ms: RETURN_DELAY_MS,
        forget_keys_after_ms: PROVIDER_FORGETS_KEYS_MS,
        webhook_duplicate_rate: 0.2,
        webhook_reorder_rate: 0.2,
        webhook_reorder_max_ms: 1_000,
        webhook_loss_rate: 0.15,
        webhook_retry_max_ms: 2_000,
        webhook_attempts_max: 60,
        ..Faults::default()
    }
}

/// The provider's behaviour with `active` faults on top of its base.
fn provider_now(active: &[(FaultKind, Instant)]) -> Faults {
    active
        .iter()
        .fold(provider_base(), |faults, (kind, _)| provider_fault(*kind, faults).0)
}

/// Runs a payout storm and returns its report.
pub async fn chaos_payouts(opts: PayoutChaosOptions) -> anyhow::Result<ChaosReport> {
    opts.check()?;
    let scratch = tempfile::Builder::new().prefix("settled-chaos-").tempdir()?;
    let place = ChaosDb::create(&opts.database_url, scratch.path()).await?;
    let result = run(&opts, &place.url, place.server.as_ref(), scratch.path()).await;
    place.finish(result, scratch).await
}

/// The `settled deliver` processes.
struct Deliverers {
    exe: PathBuf,
    url: String,
    provider_url: String,
    lease_ttl_ms: u64,
    log_dir: PathBuf,
    spawned: usize,
}

impl Fleet for Deliverers {
    fn respawn(&mut self) -> anyhow::Result<tokio::process::Child> {
        self.spawned += 1;
        let log = std::fs::File::create(self.log_dir.join(format!("deliver-{}.log", self.spawned)))?;
        let ttl = self.lease_ttl_ms;
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(["deliver", "--provider-url", &self.provider_url])
            // Shorter than the late applies' 1.5 s: their answers are lost.
            .args(["--provider-timeout-ms", "500", "--provider-rate", "2000"])
            .args(["--concurrency", "2", "--batch", "10", "--provider-concurrency", "16"])
            .args(["--lease-ttl-ms", &ttl.to_string()])
            // Retried past the window, a payment is found by its reference;
            // a return whose webhook was lost, by a look-up a second later.
            .args(["--provider-key-window", DELIVERERS_KEY_WINDOW])
            .args(["--returns-poll-every", "1s", "--returns-watch", "1h"])
            .args(["--rescue-interval-ms", &(ttl / 4).max(50).to_string()])
            // A lost webhook is made good by a look-up a second later.
            .args([
                "--poll-after-secs",
                "1",
                "--max-poll-ms",
                "500",
                "--shutdown-grace-ms",
                "1000",
            ])
            .env("DATABASE_URL", &self.url)
            .env("SETTLED_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        Ok(cmd.spawn()?)
    }

    fn application_name(&self) -> &'static str {
        "settled-deliver"
    }
}

/// A `settled serve` process.
struct ApiServer {
    child: tokio::process::Child,
    base: String,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn start_servers(exe: &Path, url: &str, n: u32, log_dir: &Path) -> anyhow::Result<Vec<ApiServer>> {
    let mut servers = Vec::new();
    for i in 0..n {
        let port = free_port()?;
        let log = std::fs::File::create(log_dir.join(format!("serve-{i}.log")))?;
        let child = tokio::process::Command::new(exe)
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .args(["--confirm-ttl-secs", &CONFIRM_TTL_SECS.to_string()])
            .env("DATABASE_URL", url)
            .env("SETTLED_API_TOKEN", API_TOKEN)
            .env("SETTLED_PROVIDER_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("SETTLED_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()?;
        servers.push(ApiServer {
            child,
            base: format!("http://127.0.0.1:{port}"),
        });
    }
    let http = reqwest::Client::new();
    for server in &servers {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http.get(format!("{}/readyz", server.base)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "settled serve at {} did not come up",
                server.base
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(servers)
}

/// Seeds and settles the period (`settled worker` in its own process), and
/// returns the creators with a balance, and their balances.
async fn balances(
    db: &Database,
    exe: &Path,
    url: &str,
    opts: &PayoutChaosOptions,
) -> anyhow::Result<Vec<(String, u128)>> {
    let period = Period::parse(PERIOD).map_err(anyhow::Error::msg)?;
    seed::seed(
        &db.pool,
        period,
        opts.creators,
        opts.seed,
        Some(FeeBps::new(250).map_err(anyhow::Error::msg)?),
        seed::Volumes::Realistic,
        &Progress::hidden(),
    )
    .await?;
    crate::settle_in_a_worker(exe, url, PERIOD).await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT creator, balance::text FROM settlement.creator_balance WHERE balance > 30 ORDER BY creator",
    )
    .fetch_all(&db.pool)
    .await?;
    anyhow::ensure!(!rows.is_empty(), "no creator has a balance to pay out from");
    rows.into_iter()
        .map(|(c, b)| Ok((c, b.parse::<u128>().with_context(|| format!("balance {b}"))?)))
        .collect()
}

async fn run(
    opts: &PayoutChaosOptions,
    url: &str,
    server: Option<&LocalPostgres>,
    scratch: &Path,
) -> anyhow::Result<ChaosReport> {
    let exe = std::env::current_exe()?;
    let db = Database::open_url(url, 4, "settled-chaos").await?;
    eprintln!("chaos: settling {} creators to pay out from", opts.creators);
    let creators = balances(&db, &exe, url, opts).await?;

    let servers = start_servers(&exe, url, opts.servers, scratch).await?;
    let endpoints: Vec<WebhookEndpoint> = servers
        .iter()
        .map(|s| WebhookEndpoint {
            url: format!("{}/v1/provider-events", s.base),
            secret: WEBHOOK_SECRET.into(),
        })
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider_url = format!("http://{}", listener.local_addr()?);
    let sim = tokio::spawn(crate::provider_sim::serve_with(
        listener,
        Options {
            faults: provider_base(),
            seed: opts.seed,
            webhook: Some(endpoints[0].clone()),
        },
    ));
    let mut fleet = Deliverers {
        exe: exe.clone(),
        url: url.to_string(),
        provider_url: provider_url.clone(),
        lease_ttl_ms: opts.lease_ttl_ms,
        log_dir: scratch.to_path_buf(),
        spawned: 0,
    };
    let mut slots = Vec::new();
    for _ in 0..opts.deliverers {
        slots.push(Slot {
            child: Some(fleet.respawn()?),
            stopped_until: None,
            held_when_paused: Vec::new(),
        });
    }
    let duration = Duration::from_secs(opts.duration);
    let plan = Plan::new(opts.seed, &creators, opts.requests, duration * 7 / 10);
    let storm = Storm::new(plan, servers.iter().map(|s| s.base.clone()).collect())?;
    let faults = payout_schedule(opts.seed, duration, opts.deliverers, server.is_some());
    eprintln!(
        "chaos: {} payout requests from {} clients to {} servers, {} deliverers, {} faults over {} s (seed {})",
        opts.requests,
        opts.clients,
        opts.servers,
        opts.deliverers,
        faults.len(),
        opts.duration,
        opts.seed
    );
    let clients = storm.start(opts.clients, opts.seed);
    let ctx = Storming {
        opts,
        url,
        server,
        provider_url: &provider_url,
        scratch,
    };
    let stormed = ctx
        .storm(faults, &mut slots, &mut fleet, servers, clients, &storm, &endpoints)
        .await;
    storm.stop();
    if stormed.is_err() {
        sim.abort();
    }
    let (mut servers, injected, zombies) = stormed?;
    stop_deliverers(&mut slots).await;

    let mut conn = PgConnection::connect(url).await?;
    let period = Period::parse(PERIOD).map_err(anyhow::Error::msg)?;
    let report = verify::verify(&mut conn, period).await?;
    let mut invariants = invariants_of(&report);
    let payments = HttpProvider::new(&provider_url, Duration::from_secs(60))?
        .list_all()
        .await?;
    let sim_counters: SimCounters = reqwest::get(format!("{provider_url}/v1/counters"))
        .await?
        .json()
        .await?;
    let logs = storm.log.intents.lock().expect("log").clone();
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let evidence = checks::Evidence {
        intents: storm.intents(),
        logs: &logs,
        payments: &payments,
        sim: sim_counters,
        api_replays: storm.log.replayed.load(relaxed),
        api_in_progress: storm.log.in_progress.load(relaxed),
        client_retries: storm.log.retries.load(relaxed),
    };
    let (payout_invariants, counts) = checks::check(&mut conn, &evidence).await?;
    invariants.extend(payout_invariants);
    if let Some(server) = servers.first() {
        invariants.push(statements::statements_add_up(&mut conn, &server.base).await?);
    }
    let mut injected = injected;
    injected.push(format!("{zombies} deliverer(s) paused past their leases"));
    for s in servers.iter_mut() {
        let _ = s.child.kill().await;
    }
    sim.abort();
    conn.close().await?;
    db.close().await?;
    let ok = invariants.iter().all(|(_, ok, _)| *ok);
    Ok(ChaosReport {
        seed: opts.seed,
        injected,
        invariants,
        ok,
        payouts: Some(counts),
    })
}

/// SIGCONT then SIGTERM to every deliverer; killed if still running after
/// a few seconds.
async fn stop_deliverers(slots: &mut [Slot]) {
    for slot in slots.iter_mut() {
        let Some(mut child) = slot.child.take() else { continue };
        if let Some(pid) = child.id() {
            let pid = Pid::from_raw(pid as i32);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = kill(pid, Signal::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

/// What the storm's loop needs.
struct Storming<'a> {
    opts: &'a PayoutChaosOptions,
    url: &'a str,
    server: Option<&'a LocalPostgres>,
    provider_url: &'a str,
    scratch: &'a Path,
}

type Stormed = (Vec<ApiServer>, Vec<String>, u32);

impl Storming<'_> {
    /// Injects the faults, keeps the deliverers running, and waits until the
    /// clients are done and no payout is left created, queued or sent.
    #[allow(clippy::too_many_arguments)]
    async fn storm(
        &self,
        faults: Vec<super::ScheduledFault>,
        slots: &mut [Slot],
        fleet: &mut Deliverers,
        mut servers: Vec<ApiServer>,
        mut clients: tokio::task::JoinSet<()>,
        storm: &Storm,
        endpoints: &[WebhookEndpoint],
    ) -> anyhow::Result<Stormed> {
        let http = reqwest::Client::new();
        let duration = Duration::from_secs(self.opts.duration);
        let ttl = Duration::from_millis(self.opts.lease_ttl_ms);
        let zombie_pause = ttl * 2 + ttl / 2 + Duration::from_secs(1);
        let deadline = duration + Duration::from_secs(PAYOUT_DRAIN_DEADLINE_SECS);
        let mut conn = PgConnection::connect(self.url).await?;
        let mut pending = faults.into_iter().peekable();
        let (mut injected, mut zombies) = (Vec::new(), 0u32);
        let mut provider_faults: Vec<(FaultKind, Instant)> = Vec::new();
        let mut moved_webhooks = false;
        let mut said = Duration::ZERO;
        let started = Instant::now();
        loop {
            let now = started.elapsed();
            while pending.peek().is_some_and(|f| Duration::from_millis(f.at_ms) <= now) {
                let fault = pending.next().expect("peeked");
                // A provider fault goes on top of those still under way.
                let targets = Targets {
                    server: self.server,
                    url: self.url,
                    provider_url: Some(self.provider_url),
                    provider_base: provider_now(&provider_faults),
                    zombie_pause,
                    provider_fault_secs: PROVIDER_FAULT_SECS,
                };
                let line = inject(&fault, slots, fleet, &targets, &mut conn, &http)
                    .await
                    .unwrap_or_else(|e| {
                        format!("{:>6.1}s {:?}: failed to inject: {e:#}", now.as_secs_f64(), fault.kind)
                    });
                zombies += u32::from(fault.kind == FaultKind::ZombieWorker && line.contains("SIGSTOP"));
                if matches!(
                    fault.kind,
                    FaultKind::ProviderErrors | FaultKind::ProviderAppliedTimeout | FaultKind::ProviderRateLimits
                ) {
                    provider_faults.push((fault.kind, Instant::now() + Duration::from_secs(PROVIDER_FAULT_SECS)));
                }
                eprintln!("chaos: {line}");
                injected.push(line);
            }
            let before = provider_faults.len();
            provider_faults.retain(|(_, until)| Instant::now() < *until);
            if provider_faults.len() < before {
                http.post(format!("{}/v1/faults", self.provider_url))
                    .json(&provider_now(&provider_faults))
                    .send()
                    .await?
                    .error_for_status()?;
            }
            if !moved_webhooks && now >= duration / 2 && endpoints.len() > 1 {
                moved_webhooks = true;
                http.post(format!("{}/v1/webhook-endpoint", self.provider_url))
                    .json(&endpoints[1])
                    .send()
                    .await?
                    .error_for_status()?;
                injected.push(format!(
                    "{:>6.1}s webhooks moved to the second server",
                    now.as_secs_f64()
                ));
            }
            self.tend(slots, fleet, &mut servers)?;
            let had_clients = !clients.is_empty();
            while let Some(done) = clients.try_join_next() {
                done.context("a chaos client panicked")?;
            }
            if had_clients && clients.is_empty() {
                eprintln!("chaos: {:>6.1}s every request answered", now.as_secs_f64());
            }
            if pending.peek().is_none() && clients.is_empty() && now >= duration && provider_faults.is_empty() {
                match unfinished(&mut conn, &http, self.provider_url).await {
                    Ok(open) if open.is_empty() => break,
                    Ok(open) => {
                        if now >= said + Duration::from_secs(5) {
                            said = now;
                            eprintln!("chaos: {:>6.1}s draining: {open}", now.as_secs_f64());
                        }
                    }
                    Err(_) => {
                        if let Ok(c) = PgConnection::connect(self.url).await {
                            conn = c;
                        }
                    }
                }
            }
            if now > deadline {
                storm.stop();
                anyhow::bail!(
                    "the payouts did not drain within {} s; logs are in {}",
                    deadline.as_secs(),
                    self.scratch.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "chaos: drained after {:.1} s; checking invariants",
            started.elapsed().as_secs_f64()
        );
        Ok((servers, injected, zombies))
    }

    /// Wakes the paused deliverers whose pause is over, starts a new one in
    /// the place of one that ended, and fails the run if one could not run
    /// or a server ended.
    fn tend(&self, slots: &mut [Slot], fleet: &mut Deliverers, servers: &mut [ApiServer]) -> anyhow::Result<()> {
        for slot in slots.iter_mut() {
            if slot.stopped_until.is_some_and(|t| Instant::now() >= t) {
                slot.stopped_until = None;
                if let Some(pid) = slot.child.as_ref().and_then(|c| c.id()) {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
                }
            }
            if let Some(child) = &mut slot.child {
                match child.try_wait()? {
                    None => continue,
                    // Could not start (2) or panicked (101): a bug, not a fault.
                    Some(status) if matches!(status.code(), Some(2) | Some(101)) => anyhow::bail!(
                        "a deliverer could not run ({status}); logs are in {}",
                        self.scratch.display()
                    ),
                    Some(_) => {}
                }
            }
            slot.child = Some(fleet.respawn()?);
        }
        for server in servers.iter_mut() {
            if let Some(status) = server.child.try_wait()? {
                anyhow::bail!(
                    "settled serve at {} ended ({status}); logs are in {}",
                    server.base,
                    self.scratch.display()
                );
            }
        }
        Ok(())
    }
}

/// Payouts not final yet, by state, and returns the provider made that
/// settled has not applied yet ("" when none).
async fn unfinished(conn: &mut PgConnection, http: &reqwest::Client, provider_url: &str) -> anyhow::Result<String> {
    // Read before settled's returns: a return applied meanwhile is counted
    // on both sides, never on settled's alone.
    let sim: SimCounters = http
        .get(format!("{provider_url}/v1/counters"))
        .send()
        .await?
        .json()
        .await?;
    let (open, returned, recently_paid): (Option<String>, i64, i64) = sqlx::query_as(
        "SELECT (SELECT string_agg(n || ' ' || status, ', ') FROM (
                     SELECT status, count(*) AS n FROM settlement.payouts
                     WHERE status IN ('created', 'queued', 'sent') GROUP BY status) s),
                (SELECT count(*) FROM settlement.payouts WHERE status = 'returned'),
                -- A payout paid within the return delay may still be returned.
                (SELECT count(*) FROM settlement.payouts
                 WHERE status = 'paid' AND finished_at > now() - $1 * interval '1 millisecond')",
    )
    .bind((RETURN_DELAY_MS * 4) as i64) // $1
    .fetch_one(conn)
    .await?;
    let mut open = open.unwrap_or_default();
    let behind = sim.returned as i64 - returned;
    if behind != 0 || recently_paid > 0 {
        if !open.is_empty() {
            open.push_str(", ");
        }
        open.push_str(&format!(
            "{behind} return(s) not applied yet, {recently_paid} payout(s) paid within the return delay"
        ));
    }
    Ok(open)
}
