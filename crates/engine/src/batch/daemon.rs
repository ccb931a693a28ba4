//! The scheduling daemon's loop (the public face is [`crate::daemon`]): at
//! each due time of the job's [`Schedule`], the scope it covers gets its
//! run (one daemon's insert creates it, the others join); missed runs are
//! caught up oldest first; a finished run whose items became eligible again
//! is reopened; idle, it sleeps until the next due time, a notification or
//! the next poll.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::batch::drainer::Drainer;
use crate::batch::job::{Job, RunHooks};
use crate::batch::runs::{ITEMS_CHANNEL, RUNS_CHANNEL};
use crate::batch::schedule::{Schedule, MAX_CATCH_UP_DAYS};
use crate::batch::stats::DrainConfig;
use crate::batch::workers::Worker;
use crate::common::error::EngineError;
use crate::common::outage::OutageClock;

/// Shortest pause between two looks when idle.
pub const MIN_POLL_MS: u64 = 250;

/// How a daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// When runs are due.
    pub schedule: Schedule,
    /// How many days back missed runs are created (catch-up), at most
    /// 366 days.
    pub catch_up_days: u32,
    /// Longest pause between two looks when idle (notifications wake it sooner).
    pub max_poll: Duration,
    /// How long the database may be away (connections lost, the server
    /// restarting or in recovery, a read-only primary after a demotion)
    /// before the daemon gives up; meanwhile it retries with backoff and
    /// logs one line when the outage starts and one when it ends.
    pub max_outage: Duration,
    /// Where to LISTEN for run and item changes: a pool whose connections
    /// are sessions (the job's own pool, or a direct one when the job's pool
    /// goes through a transaction pooler). None: poll only.
    pub notifications: Option<PgPool>,
}

/// Channel of the daemon's start-up self-test.
const SELF_TEST_CHANNEL: &str = "settled_engine_self_test";

/// LISTENs on `listen` and proves it with a NOTIFY sent through `pool` (so
/// both reach the same database). None, with a warning, when that fails.
async fn listener(listen: &PgPool, pool: &PgPool, worker: &Worker) -> Option<sqlx::postgres::PgListener> {
    let connected = async {
        let mut listener = sqlx::postgres::PgListener::connect_with(listen).await?;
        listener
            .listen_all([RUNS_CHANNEL, ITEMS_CHANNEL, SELF_TEST_CHANNEL])
            .await?;
        let token = worker.id().to_string();
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(SELF_TEST_CHANNEL) // $1
            .bind(&token) // $2
            .execute(pool)
            .await?;
        let deadline = Instant::now() + Duration::from_secs(3);
        while let Ok(Ok(n)) =
            tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), listener.recv()).await
        {
            if n.channel() == SELF_TEST_CHANNEL && n.payload() == token {
                return Ok::<_, sqlx::Error>(Some(listener));
            }
        }
        Ok(None)
    };
    match connected.await {
        Ok(Some(listener)) => {
            tracing::info!("notifications: LISTEN (self-test passed)");
            Some(listener)
        }
        Ok(None) => {
            tracing::warn!("notifications: the LISTEN self-test got no NOTIFY back within 3 s (a transaction pooler?); polling instead");
            None
        }
        Err(err) => {
            tracing::warn!(error = %err, "notifications: cannot LISTEN; polling instead");
            None
        }
    }
}

/// Runs the daemon until `worker`'s stop is requested.
pub async fn run<H: RunHooks, D: Drainer>(
    job: &Job<H>,
    pool: &PgPool,
    drainer: &D,
    cfg: &DrainConfig,
    worker: &Worker,
    daemon: &DaemonConfig,
) -> Result<(), EngineError> {
    if daemon.catch_up_days > MAX_CATCH_UP_DAYS {
        return Err(EngineError::Config(format!(
            "catch-up days must be at most {MAX_CATCH_UP_DAYS}, got {}",
            daemon.catch_up_days
        )));
    }
    let listener = match &daemon.notifications {
        Some(listen) => listener(listen, pool, worker).await,
        None => {
            tracing::info!(
                max_poll_ms = daemon.max_poll.as_millis() as u64,
                "notifications: none (behind a transaction pooler without a direct URL); polling"
            );
            None
        }
    };
    tracing::info!(
        job = job.name(), worker = %worker.id(), schedule = daemon.schedule.expression(),
        tz = %daemon.schedule.tz(), catch_up_days = daemon.catch_up_days, "daemon started"
    );
    let mut state = LoopState {
        warned: HashSet::new(),
        poll: Duration::from_millis(MIN_POLL_MS),
        listener,
    };
    let d = Daemon {
        job,
        pool,
        drainer,
        cfg,
        worker,
        daemon,
    };
    // The worker's outage clock, shared with its drains: an outage counts
    // from the first failure any of them saw.
    let clock = &worker.stats().outage;
    let mut outage: Option<Instant> = None;
    let mut backoff = Duration::from_millis(MIN_POLL_MS);
    while !worker.stop_requested() {
        let stepped = match outage {
            // While the database is away, a look waits for a connection no
            // longer than the limit allows.
            Some(_) => match reachable(pool, clock, daemon.max_outage).await {
                Ok(()) => step(&d, &mut state).await,
                Err(err) => Err(err),
            },
            None => step(&d, &mut state).await,
        };
        match stepped {
            Ok(()) => {
                clock.recovered();
                if let Some(since) = outage.take() {
                    let down_secs = since.elapsed().as_secs_f64();
                    tracing::info!(down_secs, "database reachable again; carrying on");
                }
                backoff = Duration::from_millis(MIN_POLL_MS);
            }
            Err(err) if err.is_transient() => {
                let since = clock.failed(Instant::now());
                outage.get_or_insert_with(|| {
                    let max_outage_secs = daemon.max_outage.as_secs();
                    tracing::warn!(error = %err, max_outage_secs, "database unavailable; retrying with backoff");
                    since
                });
                if since.elapsed() > daemon.max_outage {
                    return Err(EngineError::Unavailable {
                        secs: since.elapsed().as_secs(),
                        last: err.to_string(),
                    });
                }
                // Never past the limit: the next look then gives up at once.
                let left = daemon.max_outage.saturating_sub(since.elapsed());
                tokio::time::sleep(backoff.min(left + Duration::from_millis(10))).await;
                backoff = (backoff * 2).min(MAX_OUTAGE_BACKOFF);
            }
            Err(err) => return Err(err.refused(pool).await),
        }
    }
    Ok(())
}

/// Longest pause between two tries while the database is away.
pub const MAX_OUTAGE_BACKOFF: Duration = Duration::from_secs(5);

/// One statement on a connection waited for no longer than the outage
/// limit allows: is the database back?
async fn reachable(pool: &PgPool, clock: &OutageClock, limit: Duration) -> Result<(), EngineError> {
    let mut conn = clock.acquire(pool, limit).await?;
    sqlx::query("SELECT 1")
        .execute(&mut *conn)
        .await
        .map_err(EngineError::db("checking that the database is back"))?;
    Ok(())
}

/// What a daemon works with, from [`run`]'s arguments.
struct Daemon<'a, H, D> {
    job: &'a Job<H>,
    pool: &'a PgPool,
    drainer: &'a D,
    cfg: &'a DrainConfig,
    worker: &'a Worker,
    daemon: &'a DaemonConfig,
}

struct LoopState {
    warned: HashSet<String>,
    poll: Duration,
    listener: Option<sqlx::postgres::PgListener>,
}

/// One look: reopen, start what is due, work on the running run, or wait.
/// A transient error (the database away) comes back to the caller, which
/// waits it out; others are logged here and the loop goes on.
async fn step<H: RunHooks, D: Drainer>(d: &Daemon<'_, H, D>, state: &mut LoopState) -> Result<(), EngineError> {
    match d.job.reopen_oldest_with_work(d.pool).await {
        Err(err) if !err.is_transient() && !err.is_fatal() => {
            tracing::warn!(error = %err, "could not look for reopened work")
        }
        other => {
            other?;
        }
    }
    match start_due_runs(d.job, d.pool, d.worker, d.daemon, &mut state.warned).await {
        Err(err) if !err.is_transient() && !err.is_fatal() => tracing::warn!(error = %err, "could not start due runs"),
        other => other?,
    }
    if let Some(run) = d.job.running_run(d.pool).await? {
        match d.job.work(d.pool, &run.scope, d.drainer, d.cfg, d.worker).await {
            Ok(outcome) => tracing::info!(?outcome, "run worked"),
            // A missing grant or migration stops the daemon: it could never
            // succeed. So does a drain that gave up on the database: the
            // outage it waited out is the daemon's too.
            Err(err) if err.is_transient() || err.is_fatal() || matches!(err, EngineError::Unavailable { .. }) => {
                return Err(err)
            }
            Err(err) => {
                tracing::warn!(error = %err, "working on the run failed; retrying");
                tokio::time::sleep(state.poll).await;
            }
        }
        state.poll = Duration::from_millis(MIN_POLL_MS);
        return Ok(());
    }
    let now = database_now(d.pool).await?;
    let until_due = d
        .daemon
        .schedule
        .next_after(now)
        .and_then(|t| (t - now).to_std().ok())
        .unwrap_or(d.daemon.max_poll);
    let wait = state.poll.min(until_due + Duration::from_millis(50));
    let notified = async {
        match state.listener.as_mut() {
            Some(listener) => listener.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        notification = notified => {
            match notification {
                Ok(n) => tracing::debug!(channel = n.channel(), payload = n.payload(), "woken by notification"),
                // The listener reconnects on its next call; meanwhile the
                // statements above find out whether the database is back.
                Err(err) => {
                    let err = EngineError::db("waiting for notifications")(err);
                    if err.is_transient() {
                        return Err(err);
                    }
                    tracing::warn!(error = %err, "the notification listener failed; polling");
                }
            }
            state.poll = Duration::from_millis(MIN_POLL_MS);
        }
        _ = tokio::time::sleep(wait) => {
            state.poll = (state.poll * 2).min(d.daemon.max_poll);
        }
    }
    Ok(())
}

/// Creates the runs the schedule made due in the catch-up window, oldest
/// first. A scope whose run exists (in any state) is left alone; a scope
/// without items, or one the hooks refuse, is skipped with one warning
/// (it starts once it is ready); an older running run goes first.
async fn start_due_runs<H: RunHooks>(
    job: &Job<H>,
    pool: &PgPool,
    worker: &Worker,
    daemon: &DaemonConfig,
    warned: &mut HashSet<String>,
) -> Result<(), EngineError> {
    let now = database_now(pool).await?;
    for (fired_at, scope) in due_scopes(job.hooks(), &daemon.schedule, daemon.catch_up_days, now) {
        if job.find_run(pool, &scope).await?.is_some() {
            continue;
        }
        let has_items = {
            let mut conn = pool
                .acquire()
                .await
                .map_err(EngineError::db("acquiring a connection"))?;
            job.queue().has_items(&mut conn, &scope).await?
        };
        if !has_items {
            if warned.insert(scope.clone()) {
                tracing::warn!(scope, %fired_at, "due, but not started: the scope has no items yet (it starts once it has)");
            }
            continue;
        }
        match job.start_or_join(pool, &scope, Some(worker.id())).await {
            Ok(joined) if joined.started => {
                let catch_up = now - fired_at > chrono::Duration::minutes(1);
                tracing::info!(run = joined.run.id, scope, %fired_at, catch_up, "started the run");
            }
            Ok(_) => {}
            Err(EngineError::StartRefused { reason, .. }) => {
                if warned.insert(scope.clone()) {
                    tracing::warn!(scope, %fired_at, reason, "due, but not started (it starts once the reason is gone)");
                }
            }
            // One running run per job: the rest wait their turn, oldest first.
            Err(EngineError::OtherRunActive { .. }) => break,
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// The scopes `schedule` made due in the catch-up window ending at `now`
/// (the last `catch_up_days` days, at least one), each with its first due
/// time, oldest first: the runs the daemon creates, and the periods that
/// must be finished by their deadline.
pub fn due_scopes<H: RunHooks>(
    hooks: &H,
    schedule: &Schedule,
    catch_up_days: u32,
    now: DateTime<Utc>,
) -> Vec<(DateTime<Utc>, String)> {
    let from = now - chrono::Duration::days(i64::from(catch_up_days.clamp(1, MAX_CATCH_UP_DAYS)));
    // Several due times may cover one scope (an hourly schedule of a daily
    // job): each scope once, at its first due time.
    let mut due: Vec<(DateTime<Utc>, String)> = Vec::new();
    for (fired_at, local_date) in schedule.fire_times(from, now) {
        let scope = hooks.scope_for_due(local_date);
        if !due.iter().any(|(_, s)| *s == scope) {
            due.push((fired_at, scope));
        }
    }
    due
}

async fn database_now(pool: &PgPool) -> Result<DateTime<Utc>, EngineError> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .map_err(EngineError::db("reading the database clock"))
}
