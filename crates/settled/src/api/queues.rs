//! `/v1/queues`: continuous queues for operators. Reads (every queue's
//! state, one queue's, its dead letters) are open like the other `GET`s;
//! the verbs (pause, resume, replay, cancel) need the API token, checked by
//! the [`Authorized`] extractor before any body is read, and each runs in
//! one API write transaction whose answer says what it changed.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use settled_engine::continuous::ReplayFilter;

use super::{read_json, AppState, Authorized, Problem};
use crate::queues::{self, Cancelled, QueueError, ReplayRequest, DEAD_LETTERS_SHOWN, MAX_DEAD_LETTERS_SHOWN};

/// A queue error as the API answers it.
pub fn problem(err: QueueError) -> Problem {
    match err {
        QueueError::Unknown { .. } => Problem::not_found("unknown-queue", err.to_string()).field("name"),
        QueueError::Unusable { .. } => Problem::new(
            StatusCode::CONFLICT,
            "queue-unusable",
            "The queue's table cannot serve",
            err.to_string(),
        ),
        QueueError::BadKey { .. } => Problem::invalid("key", err.to_string()),
        QueueError::Database(err) => Problem::unavailable(err),
    }
}

fn ok(body: serde_json::Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// `GET /v1/queues`.
pub async fn list(State(state): State<AppState>) -> Result<Response, Problem> {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let views = queues::overview(&mut conn).await.map_err(Problem::unavailable)?;
    Ok(ok(json!({ "queues": views })))
}

/// `GET /v1/queues/{name}`.
pub async fn show(State(state): State<AppState>, Path(name): Path<String>) -> Result<Response, Problem> {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let view = queues::view(&mut conn, &name).await.map_err(problem)?;
    Ok(ok(json!(view)))
}

/// Query of the dead-letter listing.
#[derive(Debug, Deserialize)]
pub struct DeadQuery {
    limit: Option<String>,
}

/// `GET /v1/queues/{name}/dead?limit=N`.
pub async fn dead(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<DeadQuery>,
) -> Result<Response, Problem> {
    let limit = match q.limit.as_deref() {
        None => DEAD_LETTERS_SHOWN,
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_DEAD_LETTERS_SHOWN).contains(n))
            .ok_or_else(|| {
                Problem::bad_request(
                    "invalid-limit",
                    format!("limit must be an integer 1..={MAX_DEAD_LETTERS_SHOWN}, not {text:?}"),
                )
                .field("limit")
            })?,
    };
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let found = queues::find_usable(&mut conn, &name).await.map_err(problem)?;
    let letters = queues::dead_letters(&mut conn, &found, limit).await.map_err(problem)?;
    Ok(ok(json!({ "queue": name, "dead_letters": letters })))
}

/// `POST /v1/queues/{name}/pause`.
pub async fn pause(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    answer_paused(&state, &name, true).await
}

/// `POST /v1/queues/{name}/resume`.
pub async fn resume(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    answer_paused(&state, &name, false).await
}

/// Pauses or resumes in one API write transaction; false when the queue
/// already was so (nothing changed).
pub async fn set_paused(state: &AppState, name: &str, paused: bool) -> Result<bool, Problem> {
    let mut tx = super::begin(state).await.map_err(Problem::unavailable)?;
    let found = queues::find(&mut tx, name).await.map_err(problem)?;
    let changed = if paused {
        found.queue.pause(&mut tx).await
    } else {
        found.queue.resume(&mut tx).await
    }
    .map_err(Problem::unavailable)?;
    super::commit(state, tx).await.map_err(Problem::unavailable)?;
    Ok(changed)
}

async fn answer_paused(state: &AppState, name: &str, paused: bool) -> Result<Response, Problem> {
    let changed = set_paused(state, name, paused).await?;
    Ok(ok(json!({ "queue": name, "paused": paused, "changed": changed })))
}

/// Replays the dead letters `filter` selects in one API write transaction;
/// how many.
pub async fn replay_committed(state: &AppState, name: &str, filter: &ReplayFilter) -> Result<u64, Problem> {
    let mut tx = super::begin(state).await.map_err(Problem::unavailable)?;
    let found = queues::find_usable(&mut tx, name).await.map_err(problem)?;
    let replayed = queues::replay(&mut tx, &found, filter).await.map_err(problem)?;
    super::commit(state, tx).await.map_err(Problem::unavailable)?;
    Ok(replayed)
}

/// The body of a replay: every member optional; all that are set must hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    key: Option<String>,
    error_contains: Option<String>,
    failed_since: Option<String>,
    failed_before: Option<String>,
    limit: Option<u64>,
}

/// `POST /v1/queues/{name}/replay`: 200 with how many dead letters are
/// eligible again; 404 `no-dead-letter-matched` when the filter selects none.
pub async fn replay(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (b, _) = read_json::<ReplayBody>(&headers, body).await?;
    let request = ReplayRequest {
        key: b.key,
        error_contains: b.error_contains,
        failed_since: b.failed_since,
        failed_before: b.failed_before,
        limit: b.limit,
    };
    let filter = request
        .filter()
        .map_err(|e| Problem::invalid(e.field, e.named(e.field)))?;
    let replayed = replay_committed(&state, &name, &filter).await?;
    if replayed == 0 {
        return Err(Problem::not_found(
            "no-dead-letter-matched",
            format!(
                "no dead letter of queue {name} matches ({}); nothing changed",
                queues::describe(&filter)
            ),
        ));
    }
    let limit_reached = replayed == u64::from(filter.limit);
    Ok(ok(
        json!({ "queue": name, "replayed": replayed, "limit_reached": limit_reached }),
    ))
}

/// The body of a cancel.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    key: String,
}

/// `POST /v1/queues/{name}/cancel`: 200 when the job will not run; 404
/// `unknown-job`; 409 `job-started` when it has started or ended.
pub async fn cancel(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (b, _) = read_json::<CancelBody>(&headers, body).await?;
    let mut tx = super::begin(&state).await.map_err(Problem::unavailable)?;
    let found = queues::find_usable(&mut tx, &name).await.map_err(problem)?;
    let outcome = queues::cancel(&mut tx, &found, &b.key).await.map_err(problem)?;
    match outcome {
        Cancelled::Cancelled => {
            super::commit(&state, tx).await.map_err(Problem::unavailable)?;
            Ok(ok(json!({ "queue": name, "key": b.key, "cancelled": true })))
        }
        Cancelled::NoSuchJob => {
            Err(Problem::not_found("unknown-job", format!("queue {name} has no job {:?}", b.key)).field("key"))
        }
        Cancelled::Refused(why) => Err(Problem::new(
            StatusCode::CONFLICT,
            "job-started",
            "The job has started",
            format!("job {:?} of queue {name} was not cancelled: {why}", b.key),
        )),
    }
}
