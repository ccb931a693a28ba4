//! `settled run --period D [--reopen] [--wait | --cancel]`: operating one
//! run by hand.

use std::process::ExitCode;
use std::time::Duration;

use settled_engine::{Cancelled, ItemStatus, Reopened, Run, RunState};

use crate::cmd::{DbCommand, Outcome, DEFAULT_CHUNK, DEFAULT_CONCURRENCY};
use crate::db::Database;
use crate::period::Period;
use crate::settlement::{job, queue};
use crate::worker::{Mode, WorkerOptions};

/// Start (or join) the run of a period now; or cancel it.
///
/// Idempotent: a running run is joined, a finished run is reported and left
/// alone, a cancelled run is resumed. --reopen sets a finished run running
/// again when items of its period are eligible (they came after it
/// finished); a finished run without eligible items is left alone. --wait
/// drives it with workers in this process until it finishes. --cancel stops
/// it: workers claim nothing more for it and its leased items are given
/// back.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long)]
    period: Period,
    /// Settle it here until it finishes, then print its report.
    #[arg(long, conflicts_with = "cancel")]
    wait: bool,
    /// Cancel the run.
    #[arg(long)]
    cancel: bool,
    /// Reopen the run if it is finished and items of the period are
    /// eligible (with --wait, settle them here).
    #[arg(long, conflicts_with = "cancel")]
    reopen: bool,
    /// Claim loops with --wait.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256))]
    concurrency: u32,
    /// Creators per claim with --wait.
    #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = clap::value_parser!(u32).range(1..=10000))]
    chunk: u32,
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_worker");

    fn connections(&self) -> u32 {
        self.concurrency + 4
    }

    async fn run(self, db: &Database) -> Outcome {
        let (pool, period, scope) = (&db.pool, self.period, self.period.to_string());
        if self.cancel {
            return cancel(db, period).await;
        }
        let existing = job().find_run(pool, &scope).await?;
        match existing {
            Some(run) if run.state == RunState::Finished => {
                if !self.reopen_finished(db, run).await? {
                    return Ok(ExitCode::SUCCESS);
                }
            }
            Some(run) if run.state == RunState::Cancelled => {
                job().resume(pool, &scope).await?;
                println!("run {} of {period} resumed", run.id);
            }
            _ => {
                // An operator starting a run by hand is not a worker: no starter.
                let joined = job().start_or_join(pool, &scope, None).await?;
                let verb = if joined.started { "started" } else { "joined running" };
                println!("{verb} run {} of {period}", joined.run.id);
            }
        }
        if !self.wait {
            return Ok(ExitCode::SUCCESS);
        }
        self.wait_until_finished(db).await
    }
}

/// `--cancel`: cancels the running run of `period`, with its audit row, in
/// one transaction.
async fn cancel(db: &Database, period: crate::period::Period) -> Outcome {
    let mut tx = db.pool.begin().await?;
    let cancelled = job().cancel_in(&mut tx, &period.to_string()).await?;
    let outcome = match &cancelled {
        Cancelled::Now { released } => format!("{} {released} lease(s) given back", crate::audit::OK),
        Cancelled::NotRunning(_) => "no change: not running".to_string(),
    };
    crate::audit::record_cli(&mut tx, "run cancel", &format!("period {period}"), &outcome).await?;
    tx.commit().await?;
    match cancelled {
        Cancelled::Now { released } => println!("run of {period} cancelled; {released} leased item(s) given back"),
        Cancelled::NotRunning(state) => println!(
            "no running run for {period} (run: {})",
            state.map_or("none", RunState::as_str)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

impl Args {
    /// A finished run: reopened with --reopen when its period has eligible
    /// items (true: go on as with a running run), else reported.
    async fn reopen_finished(&self, db: &Database, run: Run) -> anyhow::Result<bool> {
        let (pool, period, scope) = (&db.pool, self.period, self.period.to_string());
        if self.reopen {
            let mut tx = pool.begin().await?;
            let reopened = job().reopen_with_work_in(&mut tx, &scope).await?;
            let outcome = match &reopened {
                Reopened::Now { eligible, .. } => format!("{} {eligible} eligible item(s)", crate::audit::OK),
                Reopened::NoWork { .. } => "no change: nothing eligible".to_string(),
                Reopened::NotFinished(_) => "no change: not finished".to_string(),
            };
            crate::audit::record_cli(&mut tx, "run reopen", &format!("period {period}"), &outcome).await?;
            tx.commit().await?;
            match reopened {
                Reopened::Now { run_id, eligible } => {
                    println!("run {run_id} of {period} reopened: {eligible} eligible item(s) to settle");
                    return Ok(true);
                }
                Reopened::NoWork { run_id } => {
                    println!("run {run_id} of {period} is finished and no item of it is eligible; nothing changed");
                }
                Reopened::NotFinished(state) => {
                    println!(
                        "run {} of {period} is {} now; not reopened",
                        run.id,
                        state.map_or("gone", RunState::as_str)
                    );
                    return Ok(state == Some(RunState::Running));
                }
            }
            return Ok(false);
        }
        println!("run {} of {period} is finished; nothing changed", run.id);
        if let Some(report) = run.report {
            println!("report: {report}");
        }
        let eligible = queue()
            .count_by_status(&mut *pool.acquire().await?, &scope)
            .await?
            .get(ItemStatus::Eligible);
        if eligible > 0 {
            println!(
                "{eligible} item(s) of {period} are eligible but its run is finished: `settled run --period {period} --reopen` settles them"
            );
        }
        Ok(false)
    }

    /// Drives the run with in-process claim loops, showing progress from
    /// exact counts, and reports how it ended.
    async fn wait_until_finished(&self, db: &Database) -> Outcome {
        let (pool, period, scope) = (&db.pool, self.period, self.period.to_string());
        let opts = WorkerOptions {
            period: Some(period),
            concurrency: self.concurrency,
            chunk: self.chunk,
            retry: Default::default(),
            metrics_bind: None,
            max_outage: settled_engine::DrainConfig::default().max_outage,
        };
        let total = queue()
            .count_by_status(&mut *pool.acquire().await?, &scope)
            .await?
            .total();
        let ticker = {
            let (pool, scope) = (pool.clone(), scope.clone());
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
        let drainer = crate::worker::drainer(
            Mode::Tx,
            None,
            Duration::ZERO,
            Default::default(),
            crate::payouts::key_window::DEFAULT_PROVIDER_KEY_WINDOW,
        )?;
        let drained = crate::worker::run_worker(pool, &opts, &drainer).await;
        ticker.abort();
        drained?;
        match job().find_run(pool, &scope).await? {
            Some(run) if run.state == RunState::Finished => {
                println!(
                    "run {} of {period} finished: {}",
                    run.id,
                    run.report.unwrap_or_default()
                );
                Ok(ExitCode::SUCCESS)
            }
            Some(run) => {
                println!("run {} of {period} is {}", run.id, run.state.as_str());
                Ok(ExitCode::from(1))
            }
            None => anyhow::bail!("the run of {period} disappeared"),
        }
    }
}
