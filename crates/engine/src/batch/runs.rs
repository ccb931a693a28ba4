//! Runs: one execution of a job for one scope, at most one per (job, scope)
//! and at most one running per job. The database decides, through a unique
//! constraint and a partial unique index, never a lock held by a process.
//!
//! These are the statements on `settled_engine.runs`; the lifecycle that
//! combines them (start, finish, cancel, reopen) is [`crate::batch::job`].

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::common::error::{is_unique_violation, EngineError};

/// A run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Workers claim its items.
    Running,
    /// Every item reached a final status; the report is stored.
    Finished,
    /// Stopped by an operator; workers claim nothing more for it.
    Cancelled,
}

impl RunState {
    /// Every state.
    pub const ALL: [RunState; 3] = [RunState::Running, RunState::Finished, RunState::Cancelled];

    fn parse(s: &str) -> Result<RunState, EngineError> {
        match s {
            "running" => Ok(RunState::Running),
            "finished" => Ok(RunState::Finished),
            "cancelled" => Ok(RunState::Cancelled),
            other => Err(EngineError::Invariant(format!("unknown run state {other:?}"))),
        }
    }

    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Finished => "finished",
            RunState::Cancelled => "cancelled",
        }
    }
}

/// A row of `settled_engine.runs`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Run {
    /// Run id.
    pub id: i64,
    /// Job name.
    pub job: String,
    /// The scope value (what the run covers) as text.
    pub scope: String,
    /// State.
    pub state: RunState,
    /// The worker whose insert created the run (None: an operator).
    pub started_by: Option<Uuid>,
    /// When it was created (database clock).
    pub started_at: DateTime<Utc>,
    /// When it finished or was cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// The stored report, once finished.
    pub report: Option<serde_json::Value>,
}

#[derive(sqlx::FromRow)]
struct RunRow {
    id: i64,
    job: String,
    scope: String,
    state: String,
    started_by: Option<Uuid>,
    started_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    report: Option<serde_json::Value>,
}

impl TryFrom<RunRow> for Run {
    type Error = EngineError;

    fn try_from(row: RunRow) -> Result<Run, EngineError> {
        Ok(Run {
            id: row.id,
            job: row.job,
            scope: row.scope,
            state: RunState::parse(&row.state)?,
            started_by: row.started_by.filter(|u| !u.is_nil()),
            started_at: row.started_at,
            finished_at: row.finished_at,
            report: row.report,
        })
    }
}

const RUN_COLUMNS: &str = "id, job, scope, state, started_by, started_at, finished_at, report";

/// The result of starting or joining a run.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The run for (job, scope).
    pub run: Run,
    /// True when this call's insert created it (the caller is the starter).
    pub started: bool,
}

/// Creates the run for (job, scope), or joins the one that exists. Exactly
/// one concurrent caller gets `started = true`. Fails with
/// [`EngineError::OtherRunActive`] when another scope of the job is running.
pub(crate) async fn start_or_join(
    conn: &mut PgConnection,
    job: &str,
    scope: &str,
    starter: Option<Uuid>,
) -> Result<Joined, EngineError> {
    let inserted: Option<RunRow> = sqlx::query_as(&format!(
        "INSERT INTO settled_engine.runs (job, scope, started_by) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING {RUN_COLUMNS}"
    ))
    .bind(job) // $1
    .bind(scope) // $2
    .bind(starter) // $3
    .fetch_optional(&mut *conn)
    .await
    .map_err(EngineError::db("creating a run"))?;
    if let Some(row) = inserted {
        return Ok(Joined {
            run: row.try_into()?,
            started: true,
        });
    }
    if let Some(run) = find(conn, job, scope).await? {
        return Ok(Joined { run, started: false });
    }
    match running(conn, job).await? {
        Some(other) => Err(EngineError::OtherRunActive {
            job: job.to_string(),
            run_id: other.id,
            scope: other.scope,
        }),
        // The other run finished between our insert and our look: try again once.
        None => Box::pin(start_or_join(conn, job, scope, starter)).await,
    }
}

/// The run for (job, scope), if any.
pub async fn find(conn: &mut PgConnection, job: &str, scope: &str) -> Result<Option<Run>, EngineError> {
    let row: Option<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM settled_engine.runs WHERE job = $1 AND scope = $2"
    ))
    .bind(job) // $1
    .bind(scope) // $2
    .fetch_optional(conn)
    .await
    .map_err(EngineError::db("reading a run"))?;
    row.map(Run::try_from).transpose()
}

/// Run `id` of `job`, if any.
pub async fn get(conn: &mut PgConnection, job: &str, id: i64) -> Result<Option<Run>, EngineError> {
    let row: Option<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM settled_engine.runs WHERE id = $1 AND job = $2"
    ))
    .bind(id) // $1
    .bind(job) // $2
    .fetch_optional(conn)
    .await
    .map_err(EngineError::db("reading a run"))?;
    row.map(Run::try_from).transpose()
}

/// The running run of a job, if any.
pub async fn running(conn: &mut PgConnection, job: &str) -> Result<Option<Run>, EngineError> {
    let row: Option<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM settled_engine.runs WHERE job = $1 AND state = 'running'"
    ))
    .bind(job) // $1
    .fetch_optional(conn)
    .await
    .map_err(EngineError::db("reading the running run"))?;
    row.map(Run::try_from).transpose()
}

/// All runs of a job, newest first, at most `limit`.
pub async fn list(conn: &mut PgConnection, job: &str, limit: i64) -> Result<Vec<Run>, EngineError> {
    let rows: Vec<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM settled_engine.runs WHERE job = $1 ORDER BY id DESC LIMIT $2"
    ))
    .bind(job) // $1
    .bind(limit) // $2
    .fetch_all(conn)
    .await
    .map_err(EngineError::db("listing runs"))?;
    rows.into_iter().map(Run::try_from).collect()
}

/// Runs of a job by state, exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct RunCounts {
    /// Running now (0 or 1).
    pub running: i64,
    /// Finished.
    pub finished: i64,
    /// Cancelled.
    pub cancelled: i64,
}

/// How many runs of `job` are in each state.
pub async fn count_by_state(conn: &mut PgConnection, job: &str) -> Result<RunCounts, EngineError> {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'running') AS running,
                count(*) FILTER (WHERE state = 'finished') AS finished,
                count(*) FILTER (WHERE state = 'cancelled') AS cancelled
         FROM settled_engine.runs WHERE job = $1",
    )
    .bind(job) // $1
    .fetch_one(conn)
    .await
    .map_err(EngineError::db("counting runs"))
}

/// Locks run `id` for the finisher; true when it is still running. False
/// too when another transaction changed the row after this REPEATABLE READ
/// snapshot began (SQLSTATE 40001): someone else finished it.
pub(crate) async fn lock_for_finish(conn: &mut PgConnection, id: i64) -> Result<bool, EngineError> {
    let locked: Result<Option<String>, sqlx::Error> =
        sqlx::query_scalar("SELECT state FROM settled_engine.runs WHERE id = $1 FOR NO KEY UPDATE")
            .bind(id) // $1
            .fetch_optional(conn)
            .await;
    match locked {
        Ok(state) => Ok(state.as_deref() == Some(RunState::Running.as_str())),
        Err(err) if err.as_database_error().and_then(|e| e.code()).as_deref() == Some("40001") => Ok(false),
        Err(err) => Err(EngineError::db("locking the run to finish it")(err)),
    }
}

/// Marks a running run finished and stores its report. Only one caller
/// succeeds (`true`); the others find it already finished.
pub(crate) async fn finish(
    conn: &mut PgConnection,
    run_id: i64,
    worker: Uuid,
    report: &serde_json::Value,
) -> Result<bool, EngineError> {
    let done = sqlx::query(
        "UPDATE settled_engine.runs
         SET state = 'finished', finished_at = now(), finished_by = $2, report = $3
         WHERE id = $1 AND state = 'running'",
    )
    .bind(run_id) // $1
    .bind(worker) // $2
    .bind(report) // $3
    .execute(conn)
    .await
    .map_err(EngineError::db("finishing a run"))?
    .rows_affected();
    Ok(done == 1)
}

/// True while run `run_id` is running.
pub async fn is_running(conn: &mut PgConnection, run_id: i64) -> Result<bool, EngineError> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM settled_engine.runs WHERE id = $1 AND state = 'running')")
        .bind(run_id) // $1
        .fetch_one(conn)
        .await
        .map_err(EngineError::db("reading a run's state"))
}

/// Cancels the running run of (job, scope). Returns false when it was not running.
pub(crate) async fn cancel(conn: &mut PgConnection, job: &str, scope: &str) -> Result<bool, EngineError> {
    let done = sqlx::query(
        "UPDATE settled_engine.runs SET state = 'cancelled', finished_at = now()
         WHERE job = $1 AND scope = $2 AND state = 'running'",
    )
    .bind(job) // $1
    .bind(scope) // $2
    .execute(conn)
    .await
    .map_err(EngineError::db("cancelling a run"))?
    .rows_affected();
    Ok(done == 1)
}

/// Rewrites the running run of any of `scopes` without changing it, in a
/// transaction that makes items of those scopes eligible: a finisher whose
/// REPEATABLE READ snapshot began before that transaction commits then
/// fails to lock the run (40001) instead of finishing it over those items,
/// and a finish already under way is waited for (so the caller can reopen
/// what it finished).
pub(crate) async fn interrupt_finish(conn: &mut PgConnection, job: &str, scopes: &[String]) -> Result<(), EngineError> {
    sqlx::query(
        "UPDATE settled_engine.runs SET state = state
         WHERE job = $1 AND scope = ANY($2) AND state = 'running'",
    )
    .bind(job) // $1
    .bind(scopes) // $2
    .execute(conn)
    .await
    .map_err(EngineError::db("interrupting a run's finish"))?;
    Ok(())
}

/// Sets the run of (job, scope) running again if it is in one of `from`.
/// Fails with [`EngineError::OtherRunActive`] while another run of the job runs.
pub(crate) async fn reopen(
    conn: &mut PgConnection,
    job: &str,
    scope: &str,
    from: &[RunState],
) -> Result<bool, EngineError> {
    let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    // Its key ranges are free again, for the loops that work what it got back.
    let done: Result<i64, sqlx::Error> = sqlx::query_scalar(
        "WITH reopened AS (
             UPDATE settled_engine.runs SET state = 'running', finished_at = NULL, finished_by = NULL
             WHERE job = $1 AND scope = $2 AND state = ANY($3)
             RETURNING id),
         freed AS (
             UPDATE settled_engine.run_key_ranges r SET taken_at = NULL
             FROM reopened o WHERE r.run_id = o.id AND r.taken_at IS NOT NULL)
         SELECT count(*) FROM reopened",
    )
    .bind(job) // $1
    .bind(scope) // $2
    .bind(&from) // $3
    .fetch_one(&mut *conn)
    .await;
    match done {
        Ok(done) => Ok(done == 1),
        Err(err) if is_unique_violation(&err, "runs_one_running_per_job") => {
            let other = running(conn, job).await?;
            Err(EngineError::OtherRunActive {
                job: job.to_string(),
                run_id: other.as_ref().map_or(0, |r| r.id),
                scope: other.map_or_else(|| "?".into(), |r| r.scope),
            })
        }
        Err(err) => Err(EngineError::db("reopening a run")(err)),
    }
}

/// The channel on which run changes are announced (payload: `job scope state`).
pub const RUNS_CHANNEL: &str = "settled_engine_runs";
/// The channel on which items that became eligible again are announced (payload: job).
pub const ITEMS_CHANNEL: &str = "settled_engine_items";

/// Announces that items of `job` became eligible again (rescued, released, retried).
pub async fn notify_items_eligible(conn: &mut PgConnection, job: &str) -> Result<(), EngineError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(ITEMS_CHANNEL) // $1
        .bind(job) // $2
        .execute(conn)
        .await
        .map_err(EngineError::db("notifying workers"))?;
    Ok(())
}
