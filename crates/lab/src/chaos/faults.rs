//! The faults chaos injects: a schedule drawn from a seed (the same seed
//! replays the same schedule), and the injection of each fault into the
//! running processes (settlement workers, or payout deliverers), the
//! database server and the provider.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use settled::worker::Mode;
use settled_embedded::LocalPostgres;
use sqlx::{Connection, PgConnection};

use super::Slot;
use crate::provider_sim::Faults;

/// The processes the faults act on.
pub(super) trait Fleet {
    /// Starts a new process in the place of one that was killed.
    fn respawn(&mut self) -> anyhow::Result<tokio::process::Child>;
    /// The `application_name` of their connections (terminated by
    /// [`FaultKind::TerminateBackends`]).
    fn application_name(&self) -> &'static str;
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
    /// The provider answers 429 with `Retry-After` to a share of calls.
    ProviderRateLimits,
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
    place(seed, kinds, duration, workers)
}

/// The payout storm's schedule: every kind once (a restart only when chaos
/// runs the server), 429s included, then more kills, pauses and
/// terminated connections, at random times within the first 80% of the run.
pub fn payout_schedule(seed: u64, duration: Duration, deliverers: u32, can_restart: bool) -> Vec<ScheduledFault> {
    let mut kinds = vec![
        FaultKind::KillWorker,
        FaultKind::ZombieWorker,
        FaultKind::TerminateBackends,
        FaultKind::ProviderErrors,
        FaultKind::ProviderRateLimits,
        FaultKind::ProviderAppliedTimeout,
    ];
    if can_restart {
        kinds.push(FaultKind::RestartPostgres);
    }
    place(seed, kinds, duration, deliverers)
}

/// `kinds` plus one extra kill, pause or termination per 6 s of the run,
/// each at a seeded time and slot.
fn place(seed: u64, mut kinds: Vec<FaultKind>, duration: Duration, workers: u32) -> Vec<ScheduledFault> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
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

/// Where the faults land, beside the processes.
pub(super) struct Targets<'a> {
    /// The database server, when chaos runs it.
    pub server: Option<&'a LocalPostgres>,
    /// The chaos database.
    pub url: &'a str,
    /// The provider simulator's base URL, if any.
    pub provider_url: Option<&'a str>,
    /// What the provider does between faults.
    pub provider_base: Faults,
    /// How long a paused process stays paused.
    pub zombie_pause: Duration,
    /// How long a provider fault lasts, in seconds.
    pub provider_fault_secs: u64,
}

/// Injects `fault`; returns what it did, for the report.
pub(super) async fn inject(
    fault: &ScheduledFault,
    slots: &mut [Slot],
    fleet: &mut dyn Fleet,
    targets: &Targets<'_>,
    conn: &mut PgConnection,
    http: &reqwest::Client,
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
                slot.child = Some(fleet.respawn()?);
                format!("{at} SIGKILL worker slot {} (pid {pid}); started a new one", fault.slot)
            }
            _ => format!("{at} SIGKILL skipped: slot {} is paused or empty", fault.slot),
        },
        FaultKind::ZombieWorker => match pid {
            Some(pid) if slot.stopped_until.is_none() => {
                kill(Pid::from_raw(pid as i32), Signal::SIGSTOP)?;
                slot.stopped_until = Some(Instant::now() + targets.zombie_pause);
                // What it holds now: each must still end once.
                let held: Vec<(String, i32)> = sqlx::query_as(
                    "SELECT t.creator, t.attempt FROM settlement.token_trade_volume t
                     JOIN settled_engine.workers w ON t.lease_owner::text = w.id::text
                     WHERE w.pid = $1 AND t.status = 'processing'",
                )
                .bind(pid as i32)
                .fetch_all(&mut *conn)
                .await?;
                let count = held.len();
                slot.held_when_paused = held;
                format!(
                    "{at} SIGSTOP worker slot {} (pid {pid}) holding {count} lease(s) for {:.1} s (past its lease), then SIGCONT",
                    fault.slot,
                    targets.zombie_pause.as_secs_f64()
                )
            }
            _ => format!("{at} zombie skipped: slot {} is paused or empty", fault.slot),
        },
        FaultKind::TerminateBackends => {
            let killed: Vec<i32> = sqlx::query_scalar(
                "WITH victims AS MATERIALIZED (
                     SELECT pid FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = $1
                       AND pid <> pg_backend_pid())
                 SELECT pid FROM victims WHERE pg_terminate_backend(pid)",
            )
            .bind(fleet.application_name()) // $1
            .fetch_all(&mut *conn)
            .await?;
            format!("{at} pg_terminate_backend on {} worker connection(s)", killed.len())
        }
        FaultKind::RestartPostgres => match targets.server {
            Some(server) => {
                let t = Instant::now();
                tokio::task::block_in_place(|| server.restart())?;
                *conn = PgConnection::connect(targets.url).await?;
                format!("{at} restarted PostgreSQL ({:.1} s)", t.elapsed().as_secs_f64())
            }
            None => format!("{at} PostgreSQL restart skipped: the server is not managed by chaos (DATABASE_URL)"),
        },
        FaultKind::ProviderErrors | FaultKind::ProviderAppliedTimeout | FaultKind::ProviderRateLimits => {
            let Some(p) = targets.provider_url else {
                return Ok(format!("{at} provider fault skipped: no provider in tx mode"));
            };
            let (faults, what) = provider_fault(fault.kind, targets.provider_base);
            http.post(format!("{p}/v1/faults"))
                .json(&faults)
                .send()
                .await?
                .error_for_status()?;
            format!("{at} provider {what} for {} s", targets.provider_fault_secs)
        }
    })
}

/// How long a provider fault lasts before the provider is back to its base.
pub(super) const PROVIDER_FAULT_SECS: u64 = 3;

/// The provider's behaviour during a provider fault (on top of `base`),
/// and its description.
pub(super) fn provider_fault(kind: FaultKind, base: Faults) -> (Faults, &'static str) {
    match kind {
        FaultKind::ProviderErrors => (
            Faults {
                error_rate: 0.3,
                ..base
            },
            "answers 503 to 30% of new payments",
        ),
        FaultKind::ProviderRateLimits => (
            Faults {
                rate_limit_rate: 0.3,
                retry_after_secs: 1,
                ..base
            },
            "answers 429 (Retry-After: 1) to 30% of calls",
        ),
        _ => (
            Faults {
                applied_timeout_rate: 0.3,
                applied_timeout_ms: 1_500,
                ..base
            },
            "applies 30% of new payments, then answers after the caller's timeout",
        ),
    }
}
