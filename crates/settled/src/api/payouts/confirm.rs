//! `POST /v1/payouts/{id}/confirm` and `/cancel`: a payout awaiting its
//! confirmation queued by its one-time token, or cancelled with its funds
//! back, each one call of the database's functions.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use settled_engine::once::token::Redemption;
use utoipa::ToSchema;

use super::{one, payout_id, Payout};
use crate::api::openapi::TAG_PAYOUTS;
use crate::api::{read_json, AppState, Authorized, Problem, ProblemType};
use crate::payouts::PayoutState;
use anyhow::Context;

/// The body of a confirmation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfirmRequest {
    /// The one-time token the payout's creation answered with.
    #[schema(format = Uuid)]
    pub token: String,
}

/// `POST /v1/payouts/{id}/confirm`: redeems the payout's one-time token and
/// queues the payout for delivery, in one call of
/// `settlement.confirm_payout`. Of racing confirmations (on any number of
/// servers) exactly one succeeds: the payout's row lock, the token's
/// conditional update and the payout's are all the database's. While the
/// creator is on hold the confirmation is refused (409
/// `creator-on-hold`), nothing changes and the token stays usable.
#[utoipa::path(post, path = "/v1/payouts/{id}/confirm", operation_id = "confirm_payout", tag = TAG_PAYOUTS,
    summary = "Confirm a payout made with \"confirm\": true; it is queued for delivery",
    params(("id" = i64, Path, minimum = 1, description = "the payout's id")),
    request_body = ConfirmRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "confirmed: the payout, queued", body = Payout),
        (status = 400, description = "the id is not an integer (invalid-id), or a malformed body"),
        (status = 403, description = "the token is not this payout's, or it was used (token-refused)"),
        (status = 404, description = "no such payout (unknown-payout)"),
        (status = 409, description = "the payout is not awaiting confirmation (payout-not-awaiting-confirmation), or its creator has an active hold (creator-on-hold: the token stays usable); `payout_status` says where the payout is"),
        (status = 410, description = "the token expired (confirmation-expired); the payout expires and its funds come back"),
    ))]
pub(crate) async fn confirm(
    State(state): State<AppState>,
    _: Authorized,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let id = payout_id(&id)?;
    let (request, _) = read_json::<ConfirmRequest>(&headers, body).await?;
    let token: uuid::Uuid = request
        .token
        .parse()
        .map_err(|_| Problem::invalid("token", "token must be the UUID the payout's creation answered with"))?;
    let confirmed = confirm_in_tx(&state, id, token).await.map_err(Problem::unavailable)?;
    match confirmed {
        Ok(payout) => Ok((StatusCode::OK, axum::Json(payout)).into_response()),
        Err(problem) => Err(problem),
    }
}

/// What `settlement.confirm_payout` answered.
#[derive(sqlx::FromRow)]
struct Confirmation {
    outcome: String,
    payout_status: Option<PayoutState>,
    active_hold: Option<i64>,
}

async fn confirm_in_tx(state: &AppState, id: i64, token: uuid::Uuid) -> anyhow::Result<Result<Payout, Problem>> {
    let mut tx = crate::api::begin(state).await?;
    let answer: Confirmation =
        sqlx::query_as("SELECT outcome, payout_status, active_hold FROM settlement.confirm_payout($1, $2)")
            .bind(id) // $1
            .bind(token) // $2
            .fetch_one(&mut *tx)
            .await?;
    if answer.outcome != "confirmed" {
        tx.rollback().await?;
        return Ok(Err(not_confirmed(id, &answer)?));
    }
    let payout = one(&mut tx, id).await?.context("the payout just confirmed")?;
    crate::api::commit(state, tx).await?;
    Ok(Ok(payout))
}

/// Why a confirmation did nothing: no such payout, the payout is past
/// confirming, its creator is on hold, the token expired, or the token is
/// not this payout's (or was used): the engine's [`Redemption`] says which.
fn not_confirmed(id: i64, answer: &Confirmation) -> anyhow::Result<Problem> {
    let status = answer.payout_status;
    let shown = status.map_or("unknown", PayoutState::as_str);
    Ok(match answer.outcome.as_str() {
        "unknown_payout" => Problem::not_found(ProblemType::UnknownPayout, format!("no payout {id}")),
        "not_awaiting_confirmation" => Problem::new(
            StatusCode::CONFLICT,
            ProblemType::PayoutNotAwaitingConfirmation,
            "The payout is not awaiting confirmation",
            format!("payout {id} is {shown}"),
        )
        .payout_status(status),
        "on_hold" => {
            let hold = answer.active_hold.unwrap_or_default();
            Problem::new(
                StatusCode::CONFLICT,
                ProblemType::CreatorOnHold,
                "The creator is on hold",
                format!(
                    "the creator of payout {id} has active hold {hold}; the payout stays awaiting confirmation, which may be sent again once the hold is released"
                ),
            )
            .hold(hold)
            .payout_status(status)
        }
        other => match Redemption::parse(other) {
            Some(Redemption::Expired) => Problem::new(
                StatusCode::GONE,
                ProblemType::ConfirmationExpired,
                "The confirmation expired",
                format!("the token of payout {id} expired; the payout expires and its funds come back"),
            ),
            Some(Redemption::Refused) => Problem::new(
                StatusCode::FORBIDDEN,
                ProblemType::TokenRefused,
                "The token does not confirm this payout",
                format!("the token is not payout {id}'s, or it was used"),
            )
            .field("token"),
            _ => anyhow::bail!("settlement.confirm_payout answered {other:?}"),
        },
    })
}

/// `POST /v1/payouts/{id}/cancel`: cancels a payout still awaiting its
/// confirmation through `settlement.cancel_payout`; its funds come back in
/// the same transaction.
#[utoipa::path(post, path = "/v1/payouts/{id}/cancel", operation_id = "cancel_payout", tag = TAG_PAYOUTS,
    summary = "Cancel a payout awaiting its confirmation; its funds come back",
    params(("id" = i64, Path, minimum = 1, description = "the payout's id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "cancelled: the payout", body = Payout),
        (status = 400, description = "the id is not an integer (invalid-id)"),
        (status = 404, description = "no such payout (unknown-payout)"),
        (status = 409, description = "only a payout awaiting confirmation can be cancelled (payout-not-cancellable); `payout_status` says where it is"),
    ))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    _: Authorized,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let id = payout_id(&id)?;
    let payout = cancel_by_id(&state, id).await?;
    Ok((StatusCode::OK, axum::Json(payout)).into_response())
}

/// Cancels payout `id` if it awaits its confirmation (the API's and the
/// dashboard's form): 404 for no such payout, 409 naming its state.
pub(crate) async fn cancel_by_id(state: &AppState, id: i64) -> Result<Payout, Problem> {
    let result: anyhow::Result<Result<Payout, Problem>> = async {
        let mut tx = crate::api::begin(state).await?;
        let (outcome, status): (String, Option<PayoutState>) =
            sqlx::query_as("SELECT outcome, payout_status FROM settlement.cancel_payout($1)")
                .bind(id) // $1
                .fetch_one(&mut *tx)
                .await?;
        if outcome != "cancelled" {
            tx.rollback().await?;
            return Ok(Err(match status {
                None => Problem::not_found(ProblemType::UnknownPayout, format!("no payout {id}")),
                Some(status) => Problem::new(
                    StatusCode::CONFLICT,
                    ProblemType::PayoutNotCancellable,
                    "Only a payout awaiting confirmation can be cancelled",
                    format!("payout {id} is {status}"),
                )
                .payout_status(Some(status)),
            }));
        }
        let payout = one(&mut tx, id).await?.context("the payout just cancelled")?;
        crate::api::commit(state, tx).await?;
        Ok(Ok(payout))
    }
    .await;
    result.map_err(Problem::unavailable)?
}
