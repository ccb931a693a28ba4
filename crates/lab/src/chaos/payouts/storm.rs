//! The storm's loop: faults injected on schedule, the deliverers kept
//! running, until the clients are done and every payout is final, and what
//! is left unfinished named.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use settled_embedded::LocalPostgres;
use sqlx::{Connection, PgConnection};

use super::clients::Storm;
use super::fleet::{ApiServer, Deliverers};
use super::{provider_now, PayoutChaosOptions, PAYOUT_DRAIN_DEADLINE_SECS, PROVIDER_FAULT_SECS, RETURN_DELAY_MS};
use crate::chaos::faults::{inject, FaultKind, Fleet, Targets};
use crate::chaos::Slot;
use crate::provider_sim::{SimCounters, WebhookEndpoint};

/// What the storm's loop needs.
pub(super) struct Storming<'a> {
    pub(super) opts: &'a PayoutChaosOptions,
    pub(super) url: &'a str,
    pub(super) server: Option<&'a LocalPostgres>,
    pub(super) provider_url: &'a str,
    pub(super) scratch: &'a Path,
}

type Stormed = (Vec<ApiServer>, Vec<String>, u32);

impl Storming<'_> {
    /// Injects the faults, keeps the deliverers running, and waits until the
    /// clients are done and no payout is left created, queued or sent.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn storm(
        &self,
        faults: Vec<crate::chaos::ScheduledFault>,
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
