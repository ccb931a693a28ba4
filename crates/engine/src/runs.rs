//! Runs: one execution of a job for one period, at most one per (job,
//! period) and at most one running per job. The database decides, through a
//! unique constraint and a partial unique index, never a lock held by a process.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::EngineError;

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
    /// Period (scope value) as text.
    pub period: String,
    /// State.
    pub state: RunState,
    /// The worker whose insert created the run.
    pub started_by: Option<Uuid>,
    /// When it was created (database clock).
    pub started_at: DateTime<Utc>,
    /// When it finished or was cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// The stored report, once finished.
    pub report: Option<serde_json::Value>,
}

type RunRow = (
    i64,
    String,
    String,
    String,
    Option<Uuid>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<serde_json::Value>,
);

const RUN_COLUMNS: &str = "id, job, period, state, started_by, started_at, finished_at, report";

fn run_from_row(row: RunRow) -> Result<Run, EngineError> {
    Ok(Run {
        id: row.0,
        job: row.1,
        period: row.2,
        state: RunState::parse(&row.3)?,
        started_by: row.4,
        started_at: row.5,
        finished_at: row.6,
        report: row.7,
    })
}

/// The result of [`start_or_join`].
#[derive(Debug, Clone)]
pub struct Joined {
    /// The run for (job, period).
    pub run: Run,
    /// True when this call's insert created it (the caller is the starter).
    pub started: bool,
}

/// Creates the run for (job, period), or joins the one that exists. Exactly
/// one concurrent caller gets `started = true`. Fails with
/// [`EngineError::OtherRunActive`] when another period of the job is running.
pub async fn start_or_join(
    conn: &mut PgConnection,
    job: &str,
    period: &str,
    worker: Uuid,
) -> Result<Joined, EngineError> {
    let inserted: Option<RunRow> = sqlx::query_as(&format!(
        "INSERT INTO settled_engine.runs (job, period, started_by) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING {RUN_COLUMNS}"
    ))
    .bind(job)
    .bind(period)
    .bind(worker)
    .fetch_optional(&mut *conn)
    .await
    .map_err(EngineError::db("creating a run"))?;
    if let Some(row) = inserted {
        return Ok(Joined {
            run: run_from_row(row)?,
            started: true,
        });
    }
    if let Some(run) = find(conn, job, period).await? {
        return Ok(Joined { run, started: false });
    }
    match running(conn, job).await? {
        Some(other) => Err(EngineError::OtherRunActive {
            job: job.to_string(),
            run_id: other.id,
            period: other.period,
        }),
        // The other run finished between our insert and our look: try again once.
        None => Box::pin(start_or_join(conn, job, period, worker)).await,
    }
}

/// The run for (job, period), if any.
pub async fn find(conn: &mut PgConnection, job: &str, period: &str) -> Result<Option<Run>, EngineError> {
    let row: Option<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM settled_engine.runs WHERE job = $1 AND period = $2"
    ))
    .bind(job)
    .bind(period)
    .fetch_optional(conn)
    .await
    .map_err(EngineError::db("reading a run"))?;
    row.map(run_from_row).transpose()
}

/// The running run of a job, if any.
pub async fn running(conn: &mut PgConnection, job: &str) -> Result<Option<Run>, EngineError> {
    let row: Option<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM settled_engine.runs WHERE job = $1 AND state = 'running'"
    ))
    .bind(job)
    .fetch_optional(conn)
    .await
    .map_err(EngineError::db("reading the running run"))?;
    row.map(run_from_row).transpose()
}

/// All runs of a job, newest first, at most `limit`.
pub async fn list(conn: &mut PgConnection, job: &str, limit: i64) -> Result<Vec<Run>, EngineError> {
    let rows: Vec<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM settled_engine.runs WHERE job = $1 ORDER BY id DESC LIMIT $2"
    ))
    .bind(job)
    .bind(limit)
    .fetch_all(conn)
    .await
    .map_err(EngineError::db("listing runs"))?;
    rows.into_iter().map(run_from_row).collect()
}

/// Marks a running run finished and stores its report. Only one caller
/// succeeds (`true`); the others find it already finished.
pub async fn finish(
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
    .bind(run_id)
    .bind(worker)
    .bind(report)
    .execute(conn)
    .await
    .map_err(EngineError::db("finishing a run"))?
    .rows_affected();
    Ok(done == 1)
}

/// True while run `run_id` is running.
pub async fn is_running(conn: &mut PgConnection, run_id: i64) -> Result<bool, EngineError> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM settled_engine.runs WHERE id = $1 AND state = 'running')")
        .bind(run_id)
        .fetch_one(conn)
        .await
        .map_err(EngineError::db("reading a run's state"))
}

/// Cancels the running run of (job, period): workers claim nothing more for
/// it. Returns false when it was not running.
pub async fn cancel(conn: &mut PgConnection, job: &str, period: &str) -> Result<bool, EngineError> {
    let done = sqlx::query(
        "UPDATE settled_engine.runs SET state = 'cancelled', finished_at = now()
         WHERE job = $1 AND period = $2 AND state = 'running'",
    )
    .bind(job)
    .bind(period)
    .execute(conn)
    .await
    .map_err(EngineError::db("cancelling a run"))?
    .rows_affected();
    Ok(done == 1)
}

/// Sets a cancelled (or finished) run of (job, period) running again.
/// Fails with [`EngineError::OtherRunActive`] while another run of the job runs.
pub async fn reopen(conn: &mut PgConnection, job: &str, period: &str) -> Result<bool, EngineError> {
    let done = sqlx::query(
        "UPDATE settled_engine.runs SET state = 'running', finished_at = NULL, finished_by = NULL
         WHERE job = $1 AND period = $2 AND state <> 'running'",
    )
    .bind(job)
    .bind(period)
    .execute(&mut *conn)
    .await;
    match done {
        Ok(done) => Ok(done.rows_affected() == 1),
        Err(err)
            if err
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|c| c == "23505") =>
        {
            let other = running(conn, job).await?;
            Err(EngineError::OtherRunActive {
                job: job.to_string(),
                run_id: other.as_ref().map_or(0, |r| r.id),
                period: other.map_or_else(|| "?".into(), |r| r.period),
            })
        }
        Err(err) => Err(EngineError::db("reopening a run")(err)),
    }
}

/// The channel on which run changes are announced (payload: `job period state`).
pub const RUNS_CHANNEL: &str = "settled_engine_runs";
/// The channel on which items that became eligible again are announced (payload: job).
pub const ITEMS_CHANNEL: &str = "settled_engine_items";

/// Announces that items of `job` became eligible again (rescued, released, retried).
pub async fn notify_items_eligible(conn: &mut PgConnection, job: &str) -> Result<(), EngineError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(ITEMS_CHANNEL)
        .bind(job)
        .execute(conn)
        .await
        .map_err(EngineError::db("notifying workers"))?;
    Ok(())
}
