//! `POST /v1/holds` and `POST /v1/holds/{id}/release`: at most one active
//! hold per creator, decided by a partial unique index, so two admins acting
//! at once get one hold and one 409.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::openapi::{EXAMPLE_HELD_CREATOR, TAG_CREATORS};
use super::{read_json, AppState, Authorized, Problem, ProblemType};
use crate::address::CreatorAddress;

/// Longest hold reason, in characters.
pub(crate) const MAX_HOLD_REASON_CHARS: usize = 500;

/// The request body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HoldRequest {
    /// The creator, `0x` + 40 hex digits.
    #[schema(value_type = CreatorAddress)]
    pub creator: String,
    /// Why (1..=500 characters): one line of text, no control characters
    /// or direction overrides.
    #[schema(
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]*\\S[^\\u0000-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]*$"
    )]
    pub reason: String,
}

pub(crate) use crate::settlement::Hold;

/// Places the hold through `settlement.place_hold`, which takes the
/// creator's balance-row lock first, the lock every payout takes before it
/// reads holds: once this commits, no payout that has not yet committed can
/// pay the creator. (The API's role may neither lock nor change a balance
/// itself.)
async fn place_hold(state: &AppState, creator: &CreatorAddress, reason: &str) -> anyhow::Result<Hold> {
    let mut tx = super::begin(state).await?;
    let hold: Hold =
        sqlx::query_as("SELECT id, creator, reason, created_at, released_at FROM settlement.place_hold($1, $2)")
            .bind(creator.as_str()) // $1
            .bind(reason) // $2
            .fetch_one(&mut *tx)
            .await?;
    super::audit::set_target(format!("hold {} creator {}", hold.id, hold.creator));
    super::commit(state, tx).await?;
    Ok(hold)
}

/// `POST /v1/holds`.
#[utoipa::path(post, path = "/v1/holds", operation_id = "place_hold", tag = TAG_CREATORS,
    summary = "Put a creator on hold (at most one active hold per creator)",
    request_body(content = HoldRequest, example = json!({ "creator": EXAMPLE_HELD_CREATOR, "reason": "KYC review" })),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "the hold", body = Hold),
        (status = 404, description = "unknown creator (unknown-creator)"),
        (status = 409, description = "the creator already has an active hold (hold-exists, with `existing_hold_id`)"),
    ))]
pub(crate) async fn create(
    State(state): State<AppState>,
    _: Authorized,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (request, _) = read_json::<HoldRequest>(&headers, body).await?;
    let hold = place(&state, &request).await?;
    Ok((StatusCode::CREATED, axum::Json(hold)).into_response())
}

/// Places the hold `request` asks for (the API's and the dashboard's form):
/// the reason checked, the creator known, at most one active hold (409
/// naming the active one).
pub(crate) async fn place(state: &AppState, request: &HoldRequest) -> Result<Hold, Problem> {
    let creator =
        CreatorAddress::parse(&request.creator).map_err(|e| Problem::invalid("creator", format!("creator {e}")))?;
    let reason = request.reason.trim();
    // Control characters and bidirectional overrides would rewrite a
    // terminal or a page that shows the reason.
    let bidi = |c: char| matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if reason.chars().any(|c| c.is_control() || bidi(c)) {
        return Err(Problem::invalid(
            "reason",
            "reason must be one line of text without control characters or direction overrides (no newlines, tabs, NUL, terminal escapes)",
        ));
    }
    if reason.is_empty() || reason.chars().count() > MAX_HOLD_REASON_CHARS {
        return Err(Problem::invalid(
            "reason",
            format!("reason must be 1..={MAX_HOLD_REASON_CHARS} characters"),
        ));
    }
    if !super::creators::known(&state.pool, &creator)
        .await
        .map_err(Problem::unavailable)?
    {
        return Err(
            Problem::not_found(ProblemType::UnknownCreator, format!("creator {creator} is unknown")).field("creator"),
        );
    }
    let inserted = place_hold(state, &creator, reason).await;
    match inserted {
        Ok(row) => Ok(row),
        Err(err)
            if err
                .downcast_ref::<sqlx::Error>()
                .is_some_and(|e| settled_engine::raw::is_unique_violation(e, "creator_holds_one_active")) =>
        {
            let existing: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM settlement.creator_holds WHERE creator = $1 AND released_at IS NULL",
            )
            .bind(creator.as_str())
            .fetch_optional(&state.pool)
            .await
            .map_err(Problem::unavailable)?;
            Err(Problem::new(
                StatusCode::CONFLICT,
                ProblemType::HoldExists,
                "The creator already has an active hold",
                format!(
                    "creator {creator} already has active hold {}; release it first",
                    existing.map_or_else(|| "?".to_string(), |id| id.to_string())
                ),
            )
            .existing_hold(existing))
        }
        Err(err) => Err(Problem::unavailable(err)),
    }
}

/// `POST /v1/holds/{id}/release`: releases the hold, and the creator's held
/// items become eligible again (paid once, by their period's run, which a
/// worker reopens).
#[utoipa::path(post, path = "/v1/holds/{id}/release", operation_id = "release_hold", tag = TAG_CREATORS,
    summary = "Release a hold; the creator's held items are paid by their runs",
    params(("id" = i64, Path, minimum = 1, description = "the hold's id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the released hold", body = Hold),
        (status = 400, description = "the id is not an integer (invalid-id)"),
        (status = 404, description = "no such hold (unknown-hold)"),
        (status = 409, description = "already released (hold-already-released)"),
    ))]
pub(crate) async fn release(
    State(state): State<AppState>,
    _: Authorized,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::bad_request(ProblemType::InvalidId, "hold id must be an integer").field("id"))?;
    let hold = release_by_id(&state, id).await?;
    Ok((StatusCode::OK, axum::Json(hold)).into_response())
}

/// Releases hold `id` (the API's and the dashboard's form): 404 for no such
/// hold, 409 when it was already released.
pub(crate) async fn release_by_id(state: &AppState, id: i64) -> Result<Hold, Problem> {
    let released: anyhow::Result<_> = async {
        let mut tx = super::begin(state).await?;
        let (released, periods) = crate::settlement::release_hold(&mut tx, id).await?;
        if matches!(released, crate::settlement::Released::Now(_)) {
            super::commit(state, tx).await?;
            crate::settlement::reopen_released(&state.pool, &periods).await;
        }
        Ok(released)
    }
    .await;
    let released = released.map_err(Problem::unavailable)?;
    match released {
        crate::settlement::Released::Now(row) => Ok(row),
        crate::settlement::Released::Before => Err(Problem::new(
            StatusCode::CONFLICT,
            ProblemType::HoldAlreadyReleased,
            "The hold was already released",
            format!("hold {id} was already released"),
        )),
        crate::settlement::Released::NotFound => {
            Err(Problem::not_found(ProblemType::UnknownHold, format!("no hold {id}")))
        }
    }
}
