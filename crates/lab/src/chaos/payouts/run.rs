//! One payout chaos run: the period seeded and settled, the servers, the
//! provider simulator and the deliverers started, the storm, then the drain
//! and the checks.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use settled_embedded::LocalPostgres;
use sqlx::{Connection, PgConnection};

use super::clients::{Plan, Storm};
use super::fleet::{start_servers, stop_deliverers, Deliverers};
use super::storm::Storming;
use super::{checks, provider_base, statements, PayoutChaosOptions, PERIOD, WEBHOOK_SECRET};
use crate::chaos::faults::{payout_schedule, Fleet};
use crate::chaos::{invariants_of, seed_at_fee, ChaosReport, Slot};
use crate::provider_sim::{Options, SimCounters, WebhookEndpoint};
use settled::db::Database;
use settled::period::Period;
use settled::provider::HttpProvider;
use settled::{seed, verify};

/// Seeds and settles the period (`settled worker` in its own process), and
/// returns the creators with a balance, and their balances.
async fn balances(
    db: &Database,
    exe: &Path,
    url: &str,
    opts: &PayoutChaosOptions,
) -> anyhow::Result<Vec<(String, u128)>> {
    let period = Period::parse(PERIOD).map_err(anyhow::Error::msg)?;
    seed_at_fee(db, period, opts.creators, opts.seed, seed::Volumes::Realistic).await?;
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

pub(super) async fn run(
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
