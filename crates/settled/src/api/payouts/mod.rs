//! `POST /v1/payouts`, its confirmation and cancel, and `GET
//! /v1/payouts/{id}`: withdrawals that never pay twice. The debit, the
//! payout row and its delivery job (the outbox) are one call of the
//! database's `settlement.debit_for_payout` (the API's role may not change a
//! balance itself), in the same transaction as the stored idempotent
//! response. Confirming and cancelling are the database's
//! `settlement.confirm_payout` (which redeems the one-time token and reads
//! holds under the creator's lock) and `settlement.cancel_payout`; the API's
//! role may not move a payout otherwise.

mod confirm;
mod create;
mod request;

pub(crate) use confirm::cancel_by_id;
pub(crate) use confirm::{__path_cancel, __path_confirm, cancel, confirm};
pub(crate) use create::{__path_create, create};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::ToSchema;

use super::openapi::TAG_PAYOUTS;
use super::{AppState, Problem, ProblemType};
use crate::address::CreatorAddress;
use crate::money::Amount;
use crate::payouts::PayoutState;

/// Idempotency scope of payouts.
pub(crate) const PAYOUTS_SCOPE: &str = "payouts";

/// The request body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PayoutRequest {
    /// The creator, `0x` + 40 hex digits.
    #[schema(value_type = CreatorAddress)]
    pub creator: String,
    /// Base units as a decimal string (amounts exceed 2^53).
    #[schema(value_type = Amount)]
    pub amount: String,
    /// Hold the payout until `POST /v1/payouts/{id}/confirm` redeems the
    /// one-time token this answer carries (it expires otherwise, and its
    /// funds come back).
    #[serde(default)]
    pub confirm: bool,
}

/// A payout as the API shows it.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub(crate) struct Payout {
    /// Payout id.
    #[schema(minimum = 1)]
    pub id: i64,
    /// The creator (lower case).
    pub creator: String,
    /// Base units, decimal string.
    pub amount: String,
    /// Where the payout is.
    pub status: PayoutState,
    /// Why its last transition happened.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// The provider's id, once it accepted the payment.
    #[schema(required = true)]
    pub provider_id: Option<String>,
    /// When an unconfirmed payout expires.
    #[schema(required = true)]
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When it was made.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Its last change.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// The columns of [`Payout`], for its queries.
const PAYOUT_COLUMNS: &str =
    "id, creator, amount::text AS amount, status, reason, provider_id, expires_at, created_at, updated_at";

/// A payout just made: with its one-time confirmation token when asked for.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MadePayout {
    /// The payout.
    #[serde(flatten)]
    pub payout: Payout,
    /// The one-time token that confirms it (only when made with
    /// `"confirm": true`, and only in this answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub confirm_token: Option<uuid::Uuid>,
}

/// Payout `id`, if it exists.
async fn one(conn: &mut PgConnection, id: i64) -> anyhow::Result<Option<Payout>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {PAYOUT_COLUMNS} FROM settlement.payouts WHERE id = $1"
    ))
    .bind(id) // $1
    .fetch_optional(conn)
    .await?)
}

fn payout_id(id: &str) -> Result<i64, Problem> {
    id.parse()
        .map_err(|_| Problem::bad_request(ProblemType::InvalidId, "payout id must be an integer").field("id"))
}

/// A transition of a payout, as `GET /v1/payouts/{id}` lists them.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub(crate) struct Transition {
    /// The state it left (none for the first).
    #[schema(required = true)]
    pub from_state: Option<PayoutState>,
    /// The state it entered.
    pub to_state: PayoutState,
    /// Why.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// A payout with its history, oldest transition first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PayoutWithHistory {
    /// The payout.
    #[serde(flatten)]
    pub payout: Payout,
    /// Every transition it made.
    pub history: Vec<Transition>,
}

/// `GET /v1/payouts/{id}`: the payout and its history.
#[utoipa::path(get, path = "/v1/payouts/{id}", operation_id = "get_payout", tag = TAG_PAYOUTS,
    summary = "A payout and its history",
    params(("id" = i64, Path, minimum = 1, description = "the payout's id")),
    responses(
        (status = 200, description = "the payout", body = PayoutWithHistory),
        (status = 400, description = "the id is not an integer (invalid-id)"),
        (status = 404, description = "no such payout (unknown-payout)"),
    ))]
pub(crate) async fn show(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, Problem> {
    let id = payout_id(&id)?;
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let payout = one(&mut conn, id)
        .await
        .map_err(Problem::unavailable)?
        .ok_or_else(|| Problem::not_found(ProblemType::UnknownPayout, format!("no payout {id}")))?;
    let history: Vec<Transition> = sqlx::query_as(
        "SELECT from_state, to_state, reason, at FROM settlement.payout_history WHERE payout_id = $1 ORDER BY id",
    )
    .bind(id) // $1
    .fetch_all(&mut *conn)
    .await
    .map_err(Problem::unavailable)?;
    Ok((StatusCode::OK, axum::Json(PayoutWithHistory { payout, history })).into_response())
}
