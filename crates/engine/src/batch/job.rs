//! A job and its lifecycle: the named operations an application calls
//! instead of writing SQL against the engine's tables.
//!
//! A [`Job`] is a work table ([`WorkQueue`]) plus the application's
//! [`RunHooks`]: what a run start must check (and lock), what the final
//! report says, and which scope a due time of the schedule covers. The job
//! owns start-or-join, the one-finisher protocol, cancel, resume, retry,
//! releasing held items and reopening runs that have work again; the
//! daemon ([`crate::daemon`]) and the workers ([`Job::work`]) are built
//! from these. Every operation keeps its guarantee in the database: a unique
//! key, a conditional update, a row lock, never a check in memory. A
//! worker's turn is a `run.work` span; a start or join is `run.start`, an
//! attempt to finish `run.finish`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;
use sqlx::{PgConnection, PgPool, Postgres};
use tracing::field::Empty;
use tracing::Instrument;
use uuid::Uuid;

use crate::batch::drainer::{Drainer, RunTarget};
use crate::batch::queue::WorkQueue;
use crate::batch::runs::{self, Joined, Run, RunCounts, RunState};
use crate::batch::stats::DrainConfig;
use crate::batch::workers::Worker;
use crate::common::error::EngineError;
use crate::common::status::ItemStatus;

/// What an application adds to the engine's lifecycle of its runs.
pub trait RunHooks: Send + Sync + 'static {
    /// Runs in the transaction that creates a run, before the insert. Lock
    /// the rows the run depends on (`FOR SHARE`) so they cannot change under
    /// it, and refuse with [`EngineError::StartRefused`] when it must not
    /// start. An existing run is joined without calling this.
    fn before_start<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        scope: &'a str,
    ) -> impl Future<Output = Result<(), EngineError>> + Send + 'a {
        let _ = (tx, scope);
        async { Ok(()) }
    }

    /// The run's final report, computed once, by the finisher, in one
    /// REPEATABLE READ snapshot that also saw nothing left to do.
    fn report<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        queue: &'a WorkQueue,
        scope: &'a str,
    ) -> impl Future<Output = Result<serde_json::Value, EngineError>> + Send + 'a {
        async move {
            let counts = queue.count_by_status(tx, scope).await?;
            Ok(serde_json::json!({ "items": counts.total(), "counts": counts.to_json() }))
        }
    }

    /// The scope a due time of the schedule covers, from the local date it
    /// fired on (a daily batch at 05:00 covers the day before).
    fn scope_for_due(&self, local_date: NaiveDate) -> String {
        local_date.to_string()
    }
}

/// Hooks that add nothing: any scope may start, the report is the counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl RunHooks for NoHooks {}

/// A job: its work table and its hooks.
#[derive(Debug)]
pub struct Job<H = NoHooks> {
    queue: Arc<WorkQueue>,
    hooks: H,
}

impl<H> Clone for Job<H>
where
    H: Clone,
{
    fn clone(&self) -> Self {
        Job {
            queue: self.queue.clone(),
            hooks: self.hooks.clone(),
        }
    }
}

/// What [`Job::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The run was running and is cancelled now; this many leases were given back.
    Now {
        /// Leased items returned to `eligible` (attempt kept: their old
        /// holders are refused by the fence).
        released: u64,
    },
    /// There was no running run for the scope.
    NotRunning(Option<RunState>),
}

/// What [`Job::reopen_with_work`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reopened {
    /// The finished run is running again; this many items of its scope were eligible.
    Now {
        /// The run.
        run_id: i64,
        /// Eligible items of the scope.
        eligible: i64,
    },
    /// The run is finished and no item of its scope is eligible: left alone.
    NoWork {
        /// The run.
        run_id: i64,
    },
    /// The scope's run is not finished (its state), or it has none.
    NotFinished(Option<RunState>),
}

/// How one worker's turn at a scope ended (see [`Job::work`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkOutcome {
    /// The run was already finished or cancelled.
    RunNotRunning(i64, RunState),
    /// Nothing was left; `finished` says whether this worker marked the run finished.
    Drained {
        /// The run.
        run_id: i64,
        /// Items this worker settled in this turn.
        settled: u64,
        /// True for the one worker that finished the run.
        finished: bool,
    },
    /// Stopped on request before the run drained.
    Stopped {
        /// The run.
        run_id: i64,
        /// Items this worker settled in this turn.
        settled: u64,
    },
}

impl<H: RunHooks> Job<H> {
    /// A job over `queue` with the application's `hooks`.
    pub fn new(queue: WorkQueue, hooks: H) -> Job<H> {
        Job {
            queue: Arc::new(queue),
            hooks,
        }
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        self.queue.job()
    }

    /// The work table.
    pub fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    /// The application's hooks.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }

    /// Checks the work table against what the engine needs; the error
    /// names every missing column and index.
    pub async fn check_work_table(&self, pool: &PgPool) -> Result<(), EngineError> {
        let mut conn = acquire(pool).await?;
        self.queue.check_table(&mut conn).await
    }

    /// Creates the run of `scope` or joins the one that exists: exactly one
    /// concurrent caller's insert creates it (`started`). A new run first
    /// passes [`RunHooks::before_start`] in the same transaction. The
    /// starter refreshes the work table's planner statistics (best effort).
    pub async fn start_or_join(
        &self,
        pool: &PgPool,
        scope: &str,
        starter: Option<Uuid>,
    ) -> Result<Joined, EngineError> {
        let span = tracing::info_span!("run.start", job = self.name(), scope, run = Empty, started = Empty);
        let joined = self
            .start_or_join_in_tx(pool, scope, starter)
            .instrument(span.clone())
            .await?;
        span.record("run", joined.run.id);
        span.record("started", joined.started);
        Ok(joined)
    }

    async fn start_or_join_in_tx(
        &self,
        pool: &PgPool,
        scope: &str,
        starter: Option<Uuid>,
    ) -> Result<Joined, EngineError> {
        let mut tx = pool.begin().await.map_err(EngineError::db("beginning a run start"))?;
        if let Some(run) = runs::find(&mut tx, self.name(), scope).await? {
            tx.rollback().await.map_err(EngineError::db("ending a run join"))?;
            return Ok(Joined { run, started: false });
        }
        self.hooks.before_start(&mut tx, scope).await?;
        let joined = runs::start_or_join(&mut tx, self.name(), scope, starter).await?;
        if joined.started {
            self.refresh_statistics_in(&mut tx, scope).await?;
        }
        tx.commit().await.map_err(EngineError::db("committing a run start"))?;
        Ok(joined)
    }

    /// Input loaded moments ago may be unknown to the planner: the starter
    /// analyzes the scope's items before its run start commits, so that
    /// joiners (who wait for the run's row) plan, and cut the run's key
    /// ranges, with the same fresh statistics. Best effort, in a savepoint:
    /// a role that does not own the table cannot analyze, and autovacuum
    /// will.
    async fn refresh_statistics_in(&self, tx: &mut PgConnection, scope: &str) -> Result<(), EngineError> {
        use sqlx::Connection;
        let mut savepoint = tx.begin().await.map_err(EngineError::db("beginning a savepoint"))?;
        match self.queue.refresh_statistics(&mut savepoint, scope).await {
            Ok(_) => savepoint
                .commit()
                .await
                .map_err(EngineError::db("releasing a savepoint"))?,
            Err(err) => {
                savepoint
                    .rollback()
                    .await
                    .map_err(EngineError::db("rolling back to a savepoint"))?;
                tracing::warn!(job = self.name(), error = %err, "could not refresh the work table's statistics");
            }
        }
        Ok(())
    }

    /// Marks run `run_id` finished when nothing of `scope` is left to do;
    /// exactly one caller wins (`true`) and stores the report.
    ///
    /// Workers that drain at the same moment queue on the run's row lock,
    /// so the report is computed once, by the finisher; the others then fail
    /// the lock with a serialization error (REPEATABLE READ) and know it is
    /// finished. The lock blocks instead of skipping: a worker whose last
    /// chunk committed while another was checking must still get its own
    /// look, or nobody might finish.
    pub async fn finish_if_drained(
        &self,
        pool: &PgPool,
        run_id: i64,
        scope: &str,
        worker: Uuid,
    ) -> Result<bool, EngineError> {
        if self.queue.has_unfinished(&mut *acquire(pool).await?, scope).await? {
            return Ok(false);
        }
        let span = tracing::info_span!("run.finish", job = self.name(), run = run_id, scope, finished = Empty);
        let finished = self
            .finish_in_tx(pool, run_id, scope, worker)
            .instrument(span.clone())
            .await?;
        span.record("finished", finished);
        Ok(finished)
    }

    /// The finisher's transaction: true when this caller finished the run.
    async fn finish_in_tx(&self, pool: &PgPool, run_id: i64, scope: &str, worker: Uuid) -> Result<bool, EngineError> {
        let mut tx = pool.begin().await.map_err(EngineError::db("beginning a finish"))?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await
            .map_err(EngineError::db("beginning a finish"))?;
        let still_running = runs::lock_for_finish(&mut tx, run_id).await?;
        if !still_running || self.queue.has_unfinished(&mut tx, scope).await? {
            tx.rollback().await.map_err(EngineError::db("ending a finish"))?;
            return Ok(false);
        }
        let report = self.hooks.report(&mut tx, &self.queue, scope).await?;
        let finished = runs::finish(&mut tx, run_id, worker, &report).await?;
        tx.commit().await.map_err(EngineError::db("committing a finish"))?;
        if finished {
            tracing::info!(job = self.name(), run = run_id, scope, report = %report, "run finished");
        }
        Ok(finished)
    }

    /// Cancels the running run of `scope` and gives back every lease of the
    /// scope, in one transaction: workers claim nothing more for it, and a
    /// worker still busy with a released item is refused by the fence.
    pub async fn cancel(&self, pool: &PgPool, scope: &str) -> Result<Cancelled, EngineError> {
        let mut tx = pool.begin().await.map_err(EngineError::db("beginning a cancel"))?;
        let cancelled = self.cancel_in(&mut tx, scope).await?;
        tx.commit().await.map_err(EngineError::db("committing a cancel"))?;
        Ok(cancelled)
    }

    /// [`Job::cancel`] on the caller's transaction (so it commits with the
    /// application's own record of it); nothing is changed when the run
    /// was not running.
    pub async fn cancel_in(&self, tx: &mut PgConnection, scope: &str) -> Result<Cancelled, EngineError> {
        if !runs::cancel(&mut *tx, self.name(), scope).await? {
            let state = runs::find(&mut *tx, self.name(), scope).await?.map(|r| r.state);
            return Ok(Cancelled::NotRunning(state));
        }
        let released = self.queue.release_scope(&mut *tx, scope).await?;
        tracing::info!(job = self.name(), scope, released, "run cancelled");
        Ok(Cancelled::Now { released })
    }

    /// Sets a cancelled run of `scope` running again. False when it was not
    /// cancelled; [`EngineError::OtherRunActive`] while another run runs.
    pub async fn resume(&self, pool: &PgPool, scope: &str) -> Result<bool, EngineError> {
        runs::reopen(&mut *acquire(pool).await?, self.name(), scope, &[RunState::Cancelled]).await
    }

    /// Puts failed items of `scope` (all, or the one with `key`) back to
    /// `eligible` and reopens the scope's finished run, in one transaction.
    /// Their attempts so far stop counting toward the attempt limit, while
    /// the attempt itself (the fence) never goes down.
    pub async fn retry_failed(&self, pool: &PgPool, scope: &str, key: Option<&str>) -> Result<u64, EngineError> {
        let mut tx = pool.begin().await.map_err(EngineError::db("beginning a retry"))?;
        let retried = self.retry_failed_in(&mut tx, scope, key).await?;
        tx.commit()
            .await
            .map_err(EngineError::at_commit("committing a retry"))?;
        Ok(retried)
    }

    /// [`Job::retry_failed`] on the caller's transaction.
    pub async fn retry_failed_in(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        key: Option<&str>,
    ) -> Result<u64, EngineError> {
        let retried = self.queue.retry_failed(&mut *tx, scope, key).await?;
        if retried > 0 {
            runs::interrupt_finish(&mut *tx, self.name(), &[scope.to_string()]).await?;
            runs::reopen(&mut *tx, self.name(), scope, &[RunState::Finished]).await?;
            runs::notify_items_eligible(&mut *tx, self.name()).await?;
        }
        Ok(retried)
    }

    /// Makes every held item of `key` eligible again, on the caller's
    /// transaction (so it commits with the application's own release).
    /// Returns the scopes that got work back: pass them to
    /// [`Job::reopen_runs_with_work`] after the commit.
    pub async fn release_held(&self, tx: &mut PgConnection, key: &str) -> Result<Vec<String>, EngineError> {
        let scopes = self.queue.release_held(&mut *tx, key).await?;
        if !scopes.is_empty() {
            runs::interrupt_finish(&mut *tx, self.name(), &scopes).await?;
            runs::notify_items_eligible(tx, self.name()).await?;
        }
        Ok(scopes)
    }

    /// Reopens the finished runs of these scopes (best effort: while another
    /// run of the job is running, the daemons reopen them later).
    pub async fn reopen_runs_with_work(&self, pool: &PgPool, scopes: &[String]) {
        let mut scopes = scopes.to_vec();
        scopes.sort();
        scopes.dedup();
        for scope in scopes {
            let Ok(mut conn) = acquire(pool).await else { return };
            match runs::reopen(&mut conn, self.name(), &scope, &[RunState::Finished]).await {
                Ok(true) => tracing::info!(job = self.name(), scope, "run reopened: items became eligible again"),
                Ok(false) => {}
                Err(err) => tracing::info!(job = self.name(), scope, error = %err, "run not reopened yet"),
            }
        }
    }

    /// Reopens the finished run of `scope` when items of the scope are
    /// eligible (they arrived or came back after it finished), in one
    /// transaction; a run without eligible items is left alone.
    /// [`EngineError::OtherRunActive`] while another run of the job runs.
    pub async fn reopen_with_work(&self, pool: &PgPool, scope: &str) -> Result<Reopened, EngineError> {
        let mut tx = pool.begin().await.map_err(EngineError::db("beginning a reopen"))?;
        let outcome = self.reopen_with_work_in(&mut tx, scope).await?;
        tx.commit().await.map_err(EngineError::db("committing a reopen"))?;
        Ok(outcome)
    }

    /// [`Job::reopen_with_work`] on the caller's transaction.
    pub async fn reopen_with_work_in(&self, tx: &mut PgConnection, scope: &str) -> Result<Reopened, EngineError> {
        let run = runs::find(&mut *tx, self.name(), scope).await?;
        Ok(match run {
            Some(run) if run.state == RunState::Finished => {
                let eligible = self
                    .queue
                    .count_by_status(&mut *tx, scope)
                    .await?
                    .get(ItemStatus::Eligible);
                if eligible == 0 {
                    Reopened::NoWork { run_id: run.id }
                } else if runs::reopen(&mut *tx, self.name(), scope, &[RunState::Finished]).await? {
                    runs::notify_items_eligible(&mut *tx, self.name()).await?;
                    Reopened::Now {
                        run_id: run.id,
                        eligible,
                    }
                } else {
                    // Reopened or changed by someone else since it was read.
                    Reopened::NotFinished(runs::find(&mut *tx, self.name(), scope).await?.map(|r| r.state))
                }
            }
            other => Reopened::NotFinished(other.map(|r| r.state)),
        })
    }

    /// Reopens the oldest finished run that has eligible items again (a
    /// release or a retry while another run ran). Returns its scope.
    pub async fn reopen_oldest_with_work(&self, pool: &PgPool) -> Result<Option<String>, EngineError> {
        let scope = self.queue.finished_scope_with_work(&mut *acquire(pool).await?).await?;
        if let Some(scope) = &scope {
            self.reopen_runs_with_work(pool, std::slice::from_ref(scope)).await;
        }
        Ok(scope)
    }

    /// The run of `scope`, if any. Like every read of the job's runs, on a
    /// pool or on the caller's own connection (inside its transaction).
    pub async fn find_run<'c>(&self, db: impl Into<Db<'c>>, scope: &str) -> Result<Option<Run>, EngineError> {
        runs::find(&mut *on(db).await?, self.name(), scope).await
    }

    /// Run `id` of this job, if any.
    pub async fn get_run<'c>(&self, db: impl Into<Db<'c>>, id: i64) -> Result<Option<Run>, EngineError> {
        runs::get(&mut *on(db).await?, self.name(), id).await
    }

    /// The job's running run, if any.
    pub async fn running_run<'c>(&self, db: impl Into<Db<'c>>) -> Result<Option<Run>, EngineError> {
        runs::running(&mut *on(db).await?, self.name()).await
    }

    /// The job's runs, newest first.
    pub async fn list_runs<'c>(&self, db: impl Into<Db<'c>>, limit: i64) -> Result<Vec<Run>, EngineError> {
        runs::list(&mut *on(db).await?, self.name(), limit).await
    }

    /// How many of the job's runs are in each state.
    pub async fn count_runs<'c>(&self, db: impl Into<Db<'c>>) -> Result<RunCounts, EngineError> {
        runs::count_by_state(&mut *on(db).await?, self.name()).await
    }

    /// One worker's turn at `scope`: joins (or starts) its run, drains it
    /// with `drainer`, and finishes it when nothing is left. A fatal error
    /// (a missing grant: [`EngineError::is_fatal`]) comes back as
    /// [`EngineError::Refused`], naming the role.
    pub async fn work<D: Drainer>(
        &self,
        pool: &PgPool,
        scope: &str,
        drainer: &D,
        cfg: &DrainConfig,
        worker: &Worker,
    ) -> Result<WorkOutcome, EngineError> {
        let span =
            tracing::info_span!("run.work", job = self.name(), scope, worker = %worker.id(), mode = drainer.mode());
        let turn = async {
            let joined = self.start_or_join(pool, scope, Some(worker.id())).await?;
            let run = joined.run;
            if run.state != RunState::Running {
                let state = run.state.as_str();
                tracing::info!(run = run.id, scope, state, "run is not running; nothing to do");
                return Ok(WorkOutcome::RunNotRunning(run.id, run.state));
            }
            tracing::info!(run = run.id, scope, worker = %worker.id(), starter = joined.started, mode = drainer.mode(), "working on run");
            let stats = worker.stats();
            let settled_before = stats.items_settled.load(std::sync::atomic::Ordering::Relaxed);
            let target = RunTarget {
                pool,
                queue: &self.queue,
                run_id: run.id,
                scope,
                worker: worker.id(),
                cfg,
                stats,
            };
            drainer.drain(target).await?;
            let settled = stats.items_settled.load(std::sync::atomic::Ordering::Relaxed) - settled_before;
            if worker.stop_requested() {
                tracing::info!(run = run.id, scope, settled, "stopped on request");
                return Ok(WorkOutcome::Stopped {
                    run_id: run.id,
                    settled,
                });
            }
            let finished = self.finish_drained(pool, run.id, scope, worker.id(), cfg).await?;
            Ok::<_, EngineError>(WorkOutcome::Drained {
                run_id: run.id,
                settled,
                finished,
            })
        };
        match turn.instrument(span).await {
            Err(err) => Err(err.refused(pool).await),
            worked => worked,
        }
    }

    /// Finishes a drained run, retrying through transient errors: the
    /// database may be failing over right now, and the finish is one
    /// transaction decided by the run row's lock, so a transient error is
    /// no reason to leave the run unfinished.
    async fn finish_drained(
        &self,
        pool: &PgPool,
        run_id: i64,
        scope: &str,
        worker: Uuid,
        cfg: &DrainConfig,
    ) -> Result<bool, EngineError> {
        let mut backoff = Duration::from_millis(250);
        let started = std::time::Instant::now();
        loop {
            match self.finish_if_drained(pool, run_id, scope, worker).await {
                Err(err) if err.is_transient() && started.elapsed() < FINISH_RETRY_FOR.min(cfg.max_outage) => {
                    tracing::warn!(run = run_id, scope, error = %err, "finishing the run failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }
}

/// How long a worker retries finishing a drained run through transient
/// errors (a restart, a failover) before it gives up and leaves the finish
/// to the next worker or daemon (no longer than its outage limit).
pub const FINISH_RETRY_FOR: Duration = Duration::from_secs(300);

/// Where a read of the job's runs runs: on a connection from a pool, or on
/// the caller's own connection (inside its transaction).
#[derive(Debug)]
pub enum Db<'c> {
    /// A connection taken from the pool for the read.
    Pool(&'c PgPool),
    /// The caller's connection.
    Conn(&'c mut PgConnection),
}

impl<'c> From<&'c PgPool> for Db<'c> {
    fn from(pool: &'c PgPool) -> Db<'c> {
        Db::Pool(pool)
    }
}

impl<'c> From<&'c mut PgConnection> for Db<'c> {
    fn from(conn: &'c mut PgConnection) -> Db<'c> {
        Db::Conn(conn)
    }
}

/// A connection of a [`Db`]: pooled for the read, or borrowed.
enum Held<'c> {
    Pooled(sqlx::pool::PoolConnection<Postgres>),
    Borrowed(&'c mut PgConnection),
}

impl std::ops::Deref for Held<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Held::Pooled(conn) => conn,
            Held::Borrowed(conn) => conn,
        }
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Held::Pooled(conn) => conn,
            Held::Borrowed(conn) => conn,
        }
    }
}

async fn on<'c>(db: impl Into<Db<'c>>) -> Result<Held<'c>, EngineError> {
    Ok(match db.into() {
        Db::Pool(pool) => Held::Pooled(acquire(pool).await?),
        Db::Conn(conn) => Held::Borrowed(conn),
    })
}

async fn acquire(pool: &PgPool) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, EngineError> {
    pool.acquire().await.map_err(EngineError::db("acquiring a connection"))
}
