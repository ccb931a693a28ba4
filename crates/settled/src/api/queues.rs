//! `/v1/queues`: continuous queues for operators. Reads (every queue's
//! state, one queue's, its dead letters) are open like the other `GET`s;
//! the verbs (pause, resume, replay, cancel) need the API token, checked by
//! the [`Authorized`] extractor before any body is read, and each runs in
//! one API write transaction whose answer says what it changed.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use settled_engine::continuous::ReplayFilter;
use utoipa::ToSchema;

use super::openapi::{QueueName, TAG_QUEUES};
use super::{AppState, Authorized, JsonBody, Problem, ProblemType};
use crate::queues::{
    self, Cancelled, DeadLetter, QueueError, QueueView, ReplayRequest, DEAD_LETTERS_SHOWN, MAX_DEAD_LETTERS_SHOWN,
};

/// A queue error as the API answers it.
pub(crate) fn problem(err: QueueError) -> Problem {
    match err {
        QueueError::Unknown { .. } => Problem::not_found(ProblemType::UnknownQueue, err.to_string()).field("name"),
        QueueError::Unusable { .. } => Problem::new(
            StatusCode::CONFLICT,
            ProblemType::QueueUnusable,
            "The queue's table cannot serve",
            err.to_string(),
        ),
        QueueError::BadKey { .. } => Problem::invalid("key", err.to_string()),
        QueueError::Database(err) => Problem::unavailable(err),
    }
}

fn ok(body: impl Serialize) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// Every registered queue.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QueueList {
    /// The queues, by name.
    pub queues: Vec<QueueView>,
}

/// `GET /v1/queues`.
#[utoipa::path(get, path = "/v1/queues", operation_id = "list_queues", tag = TAG_QUEUES,
    summary = "Every registered continuous queue with its exact state (a queue whose table cannot be read carries the error)",
    responses((status = 200, description = "the queues, by name", body = QueueList)))]
pub(crate) async fn list(State(state): State<AppState>) -> Result<Response, Problem> {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let queues = queues::overview(&mut conn).await.map_err(Problem::unavailable)?;
    Ok(ok(QueueList { queues }))
}

/// `GET /v1/queues/{name}`.
#[utoipa::path(get, path = "/v1/queues/{name}", operation_id = "get_queue", tag = TAG_QUEUES,
    summary = "A continuous queue's exact state",
    params(("name" = QueueName, Path, description = "the queue")),
    responses(
        (status = 200, description = "the queue", body = QueueView),
        (status = 404, description = "no such queue (unknown-queue)"),
    ))]
pub(crate) async fn show(State(state): State<AppState>, Path(name): Path<String>) -> Result<Response, Problem> {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let view = queues::view(&mut conn, &name).await.map_err(problem)?;
    Ok(ok(view))
}

/// Query of the dead-letter listing.
#[derive(Debug, Deserialize)]
pub(crate) struct DeadQuery {
    limit: Option<String>,
}

/// A queue's dead letters.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeadLetters {
    /// The queue.
    pub queue: String,
    /// Its dead letters, newest failure first.
    pub dead_letters: Vec<DeadLetter>,
}

/// `GET /v1/queues/{name}/dead?limit=N`.
#[utoipa::path(get, path = "/v1/queues/{name}/dead", operation_id = "list_dead_letters", tag = TAG_QUEUES,
    summary = "A queue's dead letters, newest failure first",
    params(
        ("name" = QueueName, Path, description = "the queue"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "how many (50 by default)"),
    ),
    responses(
        (status = 200, description = "the dead letters", body = DeadLetters),
        (status = 400, description = "limit is not an integer 1..=1000 (invalid-limit), or a query parameter named twice"),
        (status = 404, description = "no such queue (unknown-queue)"),
        (status = 409, description = "the queue's table is missing, does not conform or cannot be read (queue-unusable)"),
    ))]
pub(crate) async fn dead(
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
                    ProblemType::InvalidLimit,
                    format!("limit must be an integer 1..={MAX_DEAD_LETTERS_SHOWN}, not {text:?}"),
                )
                .field("limit")
            })?,
    };
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let found = queues::find_usable(&mut conn, &name).await.map_err(problem)?;
    let letters = queues::dead_letters(&mut conn, &found, limit).await.map_err(problem)?;
    Ok(ok(DeadLetters {
        queue: name,
        dead_letters: letters,
    }))
}

/// A queue paused or resumed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QueuePaused {
    /// The queue.
    pub queue: String,
    /// True: paused; false: serving.
    pub paused: bool,
    /// False when the queue already was so.
    pub changed: bool,
}

/// `POST /v1/queues/{name}/pause`.
#[utoipa::path(post, path = "/v1/queues/{name}/pause", operation_id = "pause_queue", tag = TAG_QUEUES,
    summary = "Pause a queue: its workers claim nothing until it is resumed",
    params(("name" = QueueName, Path, description = "the queue")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "paused (changed: false when it already was)", body = QueuePaused),
        (status = 404, description = "no such queue (unknown-queue)"),
    ))]
pub(crate) async fn pause(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    answer_paused(&state, &name, true).await
}

/// `POST /v1/queues/{name}/resume`.
#[utoipa::path(post, path = "/v1/queues/{name}/resume", operation_id = "resume_queue", tag = TAG_QUEUES,
    summary = "Resume a paused queue and wake its workers",
    params(("name" = QueueName, Path, description = "the queue")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "serving (changed: false when it was not paused)", body = QueuePaused),
        (status = 404, description = "no such queue (unknown-queue)"),
    ))]
pub(crate) async fn resume(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    answer_paused(&state, &name, false).await
}

/// Pauses or resumes in one API write transaction; false when the queue
/// already was so (nothing changed).
pub(crate) async fn set_paused(state: &AppState, name: &str, paused: bool) -> Result<bool, Problem> {
    let mut tx = super::begin(state).await.map_err(Problem::unavailable)?;
    let found = queues::find(&mut tx, name).await.map_err(problem)?;
    let changed = if paused {
        found.queue.pause(&mut tx).await
    } else {
        found.queue.resume(&mut tx).await
    }
    .map_err(Problem::unavailable)?;
    if !changed {
        super::audit::set_outcome(if paused {
            "no change: already paused"
        } else {
            "no change: not paused"
        });
    }
    super::commit(state, tx).await.map_err(Problem::unavailable)?;
    Ok(changed)
}

async fn answer_paused(state: &AppState, name: &str, paused: bool) -> Result<Response, Problem> {
    let changed = set_paused(state, name, paused).await?;
    Ok(ok(QueuePaused {
        queue: name.to_string(),
        paused,
        changed,
    }))
}

/// Replays the dead letters `filter` selects in one API write transaction;
/// how many.
pub(crate) async fn replay_committed(state: &AppState, name: &str, filter: &ReplayFilter) -> Result<u64, Problem> {
    let mut tx = super::begin(state).await.map_err(Problem::unavailable)?;
    let found = queues::find_usable(&mut tx, name).await.map_err(problem)?;
    let replayed = queues::replay(&mut tx, &found, filter).await.map_err(problem)?;
    super::audit::set_target(format!("queue {name}: {}", queues::describe(filter)));
    super::audit::set_outcome(format!("{} {replayed} replayed", crate::audit::OK));
    super::commit(state, tx).await.map_err(Problem::unavailable)?;
    Ok(replayed)
}

/// The body of a replay: every member optional; all that are set must hold;
/// none: every dead letter (up to `limit`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayBody {
    /// This job only.
    #[schema(min_length = 1)]
    key: Option<String>,
    /// Jobs whose last error contains this text.
    #[schema(min_length = 1)]
    error_contains: Option<String>,
    /// Jobs that failed at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    failed_since: Option<String>,
    /// Jobs that failed before this time (RFC 3339; later than `failed_since`).
    #[schema(format = DateTime)]
    failed_before: Option<String>,
    /// At most this many, oldest failure first (10,000 by default).
    #[serde(default, deserialize_with = "super::integral")]
    #[schema(minimum = 1, maximum = 10000)]
    limit: Option<u64>,
}

/// How many dead letters a replay made eligible again.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Replayed {
    /// The queue.
    pub queue: String,
    /// How many.
    #[schema(minimum = 1)]
    pub replayed: u64,
    /// As many as the limit: more may match.
    pub limit_reached: bool,
}

/// `POST /v1/queues/{name}/replay`: 200 with how many dead letters are
/// eligible again; 404 `no-dead-letter-matched` when the filter selects none.
#[utoipa::path(post, path = "/v1/queues/{name}/replay", operation_id = "replay_dead_letters", tag = TAG_QUEUES,
    summary = "Make dead letters eligible again with a fresh count of attempts: one by key, or those a filter selects",
    params(("name" = QueueName, Path, description = "the queue")),
    request_body = ReplayBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "how many were replayed", body = Replayed),
        (status = 404, description = "no such queue (unknown-queue), or no dead letter matches (no-dead-letter-matched)"),
        (status = 409, description = "the queue's table is missing, does not conform or cannot be read (queue-unusable)"),
    ))]
pub(crate) async fn replay(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<ReplayBody>,
) -> Result<Response, Problem> {
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
            ProblemType::NoDeadLetterMatched,
            format!(
                "no dead letter of queue {name} matches ({}); nothing changed",
                queues::describe(&filter)
            ),
        ));
    }
    let limit_reached = replayed == u64::from(filter.limit);
    Ok(ok(Replayed {
        queue: name,
        replayed,
        limit_reached,
    }))
}

/// The body of a cancel.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    /// The job's key, as text (a value of the queue's key type).
    key: String,
}

/// A job cancelled.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct JobCancelled {
    /// The queue.
    pub queue: String,
    /// The job's key.
    pub key: String,
    /// Always true: the job will not run.
    pub cancelled: bool,
}

/// `POST /v1/queues/{name}/cancel`: 200 when the job will not run; 404
/// `unknown-job`; 409 `job-started` when it has started or ended.
#[utoipa::path(post, path = "/v1/queues/{name}/cancel", operation_id = "cancel_job", tag = TAG_QUEUES,
    summary = "Cancel a job that has not started",
    params(("name" = QueueName, Path, description = "the queue")),
    request_body = CancelBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the job will not run", body = JobCancelled),
        (status = 404, description = "no such queue (unknown-queue) or job (unknown-job)"),
        (status = 409, description = "the job has started or ended (job-started), or the queue's table cannot serve (queue-unusable)"),
    ))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    _: Authorized,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<CancelBody>,
) -> Result<Response, Problem> {
    let mut tx = super::begin(&state).await.map_err(Problem::unavailable)?;
    let found = queues::find_usable(&mut tx, &name).await.map_err(problem)?;
    let outcome = queues::cancel(&mut tx, &found, &b.key).await.map_err(problem)?;
    match outcome {
        Cancelled::Now => {
            super::audit::set_target(format!("queue {name} job {:?}", b.key));
            super::commit(&state, tx).await.map_err(Problem::unavailable)?;
            Ok(ok(JobCancelled {
                queue: name,
                key: b.key,
                cancelled: true,
            }))
        }
        Cancelled::NoSuchJob => Err(Problem::not_found(
            ProblemType::UnknownJob,
            format!("queue {name} has no job {:?}", b.key),
        )
        .field("key")),
        Cancelled::Refused(why) => Err(Problem::new(
            StatusCode::CONFLICT,
            ProblemType::JobStarted,
            "The job has started",
            format!("job {:?} of queue {name} was not cancelled: {why}", b.key),
        )),
    }
}
