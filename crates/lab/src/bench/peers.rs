//! Peer job queues, measured by the scripts under `bench/peers/<peer>/`:
//! `install` (idempotent; fetches the peer from its registry) and `run`
//! (enqueues one job per creator, drains them with the requested
//! concurrency, and prints one JSON line). Each job does the settlement's
//! work for one creator: ledger row, balance credit, item marked settled, in
//! one transaction; so `verify` checks the peers exactly as it checks
//! settled.

use std::time::Duration;

use anyhow::Context;

use super::{finish_case, prepare_case, CaseResult, Ctx};

/// Each peer runs with its defaults and with its documented fast path.
pub(super) const CONFIGS: [&str; 2] = ["defaults", "tuned"];
/// Longest install (npm, pip or cargo build of a peer).
pub(super) const INSTALL_TIMEOUT_SECS: u64 = 1_800;
/// Longest single peer case.
pub(super) const RUN_TIMEOUT_SECS: u64 = 1_800;

/// What a peer's `run` prints.
#[derive(Debug, serde::Deserialize)]
struct PeerRun {
    enqueue_seconds: f64,
    drain_seconds: f64,
    settled: u64,
    version: String,
    settings: String,
}

/// The peer's directory, absolute (its scripts run from it).
fn peer_dir(ctx: &Ctx, peer: &str) -> anyhow::Result<std::path::PathBuf> {
    peer_dir_in(&ctx.opts.peers_dir, peer)
}

/// The directory of `peer` under `peers_dir`, absolute.
pub(super) fn peer_dir_in(peers_dir: &std::path::Path, peer: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = peers_dir.join(peer);
    std::fs::canonicalize(&dir).with_context(|| format!("peer directory {}", dir.display()))
}

/// Runs the peer's `install` script.
pub(super) async fn install(ctx: &Ctx, peer: &str) -> anyhow::Result<()> {
    install_in(&ctx.opts.peers_dir, peer).await
}

/// Runs the `install` script of `peer` under `peers_dir`.
pub(super) async fn install_in(peers_dir: &std::path::Path, peer: &str) -> anyhow::Result<()> {
    let dir = peer_dir_in(peers_dir, peer)?;
    let script = dir.join("install");
    anyhow::ensure!(script.is_file(), "{} does not exist", script.display());
    eprintln!("bench: installing peer {peer} ({})", script.display());
    let status = tokio::time::timeout(
        Duration::from_secs(INSTALL_TIMEOUT_SECS),
        tokio::process::Command::new(&script)
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .status(),
    )
    .await
    .context("the install timed out")??;
    anyhow::ensure!(status.success(), "{} failed ({status})", script.display());
    Ok(())
}

/// One peer case: `workers` concurrent jobs, `creators` jobs.
pub(super) async fn peer_case(ctx: &Ctx, peer: &str, config: &str, workers: u32, creators: u64) -> CaseResult {
    let mut case = CaseResult::new("peer", peer, workers, 0, creators);
    case.config = Some(config.to_string());
    if let Err(err) = measure(ctx, peer, config, workers, creators, &mut case).await {
        case.error = Some(format!("{err:#}"));
    }
    case
}

async fn measure(
    ctx: &Ctx,
    peer: &str,
    config: &str,
    workers: u32,
    creators: u64,
    case: &mut CaseResult,
) -> anyhow::Result<()> {
    let dir = peer_dir(ctx, peer)?;
    let db = prepare_case(ctx, creators).await?;
    let measured = async {
        let cpu_before = super::client_cpu();
        let out = tokio::time::timeout(
            Duration::from_secs(RUN_TIMEOUT_SECS),
            tokio::process::Command::new(dir.join("run"))
                .current_dir(&dir)
                .env("BENCH_DATABASE_URL", &db.url)
                .env("BENCH_PERIOD", db.period.to_string())
                .env("BENCH_RUN_ID", db.run_id.to_string())
                .env("BENCH_CREATORS", creators.to_string())
                .env("BENCH_WORKERS", workers.to_string())
                .env("BENCH_CONFIG", config)
                .env("BENCH_TIME_LIMIT_SECONDS", ctx.opts.peer_time_limit.to_string())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .context("the peer run timed out")??;
        anyhow::ensure!(
            out.status.success(),
            "the peer run failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ")
        );
        // Includes the peer's schema set-up, which is outside its clock.
        case.client_cpu_seconds = Some(super::client_cpu() - cpu_before);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        let run: PeerRun = serde_json::from_str(last).with_context(|| format!("the peer's report: {last:?}"))?;
        let secs = run.enqueue_seconds + run.drain_seconds;
        case.record_time(Duration::from_secs_f64(secs));
        if run.settled < creators {
            // Stopped by the time limit: the rate is of what got done.
            case.creators_per_second = Some(run.settled as f64 / secs.max(1e-6));
            case.extra.insert("partial".into(), true.into());
            case.extra.insert("settled".into(), run.settled.into());
        }
        case.extra.insert("enqueue_seconds".into(), run.enqueue_seconds.into());
        case.extra.insert("drain_seconds".into(), run.drain_seconds.into());
        case.extra.insert("version".into(), run.version.into());
        case.extra.insert("settings".into(), run.settings.into());
        anyhow::Ok(())
    }
    .await;
    let verified = finish_case(ctx, &db).await;
    measured?;
    let mut report = verified?;
    if case.extra.contains_key("partial") {
        // Work left is expected; everything settled must still be right.
        report.checks.retain(|c| c.name != "no_work_left");
        report.ok = report.checks.iter().all(|c| c.ok);
    }
    case.set_verify(report);
    Ok(())
}
