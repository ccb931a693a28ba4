//! `settled run`, `settled runs`, `settled workers`: operating runs and
//! seeing who works on them.

use std::process::ExitCode;
use std::time::Duration;

use settled_engine::{runs, workers, RunState};
use sqlx::PgPool;
use uuid::Uuid;

use crate::period::Period;
use crate::settlement::{self, queue, JOB};
use crate::worker::{self, Mode, WorkerOptions};

/// `settled run --period D [--wait | --cancel]`.
pub async fn run(
    pool: &PgPool,
    period: Period,
    wait: bool,
    cancel: bool,
    concurrency: u32,
    chunk: u32,
) -> anyhow::Result<ExitCode> {
    let p = period.to_string();
    if cancel {
        let mut tx = pool.begin().await?;
        let cancelled = runs::cancel(&mut tx, JOB, &p).await?;
        let released = if cancelled {
            queue().release_scope(&mut tx, &p).await?
        } else {
            0
        };
        tx.commit().await?;
        if cancelled {
            println!("run of {period} cancelled; {released} leased item(s) given back");
        } else {
            let state = runs::find(&mut *pool.acquire().await?, JOB, &p)
                .await?
                .map(|r| r.state.as_str());
            println!("no running run for {period} (run: {})", state.unwrap_or("none"));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let existing = runs::find(&mut *pool.acquire().await?, JOB, &p).await?;
    match existing.as_ref().map(|r| r.state) {
        Some(RunState::Finished) => {
            let run = existing.expect("found");
            println!("run {} of {period} is finished; nothing changed", run.id);
            if let Some(report) = run.report {
                println!("report: {report}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        Some(RunState::Cancelled) => {
            runs::reopen(&mut *pool.acquire().await?, JOB, &p).await?;
            println!("run of {period} resumed");
        }
        _ => {
            // An operator starting a run by hand is not a worker: no starter id.
            let joined = settlement::start_or_join_run(pool, period, Uuid::nil()).await?;
            println!(
                "{} run {} of {period}",
                if joined.started { "started" } else { "joined running" },
                joined.run.id
            );
        }
    }
    if wait {
        let opts = WorkerOptions {
            period: Some(period),
            concurrency,
            chunk,
            work_ms: 0,
            mode: Mode::Tx,
            provider_url: None,
            provider_timeout: Duration::from_secs(2),
            leases: Default::default(),
            retry: Default::default(),
            metrics_bind: None,
        };
        // Progress from exact counts while the local workers drain the run.
        let total: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement.token_trade_volume WHERE period = $1")
            .bind(period.date())
            .fetch_one(pool)
            .await?;
        let ticker = {
            let pool = pool.clone();
            let scope = p.clone();
            tokio::spawn(async move {
                let bar = crate::progress::Progress::new("settle", total as u64);
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let Ok(mut conn) = pool.acquire().await else { continue };
                    if let Ok(left) = queue().count_unfinished(&mut conn, &scope).await {
                        bar.set((total - left).max(0) as u64);
                    }
                }
            })
        };
        let drained = worker::run_worker(pool, &opts).await;
        ticker.abort();
        drained?;
        let run = runs::find(&mut *pool.acquire().await?, JOB, &p).await?;
        match run {
            Some(run) if run.state == RunState::Finished => {
                println!(
                    "run {} of {period} finished: {}",
                    run.id,
                    run.report.unwrap_or_default()
                );
            }
            Some(run) => {
                println!("run {} of {period} is {}", run.id, run.state.as_str());
                return Ok(ExitCode::from(1));
            }
            None => anyhow::bail!("the run of {period} disappeared"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `settled runs`.
pub async fn list_runs(pool: &PgPool, limit: i64, json: bool) -> anyhow::Result<()> {
    let all = runs::list(&mut *pool.acquire().await?, JOB, limit).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!(
        "{:>5}  {:<10}  {:<9}  {:<8}  {:<19}  {:>9}  report",
        "run", "period", "state", "starter", "started (UTC)", "took"
    );
    for run in all {
        let took = run
            .finished_at
            .map(|f| format!("{:.1}s", (f - run.started_at).num_milliseconds() as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        let starter = run
            .started_by
            .filter(|u| !u.is_nil())
            .map(|u| u.simple().to_string()[..8].to_string())
            .unwrap_or_else(|| "operator".into());
        let summary = run
            .report
            .as_ref()
            .map(|r| {
                format!(
                    "settled {} failed {} held {} paid {}",
                    r["counts"]["settled"],
                    r["counts"]["failed"],
                    r["counts"]["held"],
                    r["paid"].as_str().unwrap_or("?")
                )
            })
            .unwrap_or_default();
        println!(
            "{:>5}  {:<10}  {:<9}  {:<8}  {:<19}  {:>9}  {summary}",
            run.id,
            run.period,
            run.state.as_str(),
            starter,
            run.started_at.format("%Y-%m-%d %H:%M:%S"),
            took
        );
    }
    Ok(())
}

/// `settled workers`.
pub async fn list_workers(pool: &PgPool, limit: i64, json: bool) -> anyhow::Result<()> {
    let all = workers::list(pool, Some(&queue()), limit).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!(
        "{:<8}  {:<16}  {:>7}  {:<8}  {:<7}  {:>10}  {:>8}  {:>6}  {:>10}",
        "worker", "host", "pid", "version", "state", "heartbeat", "settled", "held", "rejected"
    );
    for w in all {
        println!(
            "{:<8}  {:<16}  {:>7}  {:<8}  {:<7}  {:>9.1}s  {:>8}  {:>6}  {:>10}",
            &w.id.simple().to_string()[..8],
            w.host,
            w.pid,
            w.version,
            w.state,
            w.heartbeat_age_secs,
            w.items_settled,
            w.leases_held,
            w.fence_rejections
        );
    }
    Ok(())
}
