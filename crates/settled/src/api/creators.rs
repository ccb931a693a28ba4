//! `GET /v1/creators/{address}`: balance, holds and ledger entries.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

use super::openapi::TAG_CREATORS;
use super::{AppState, Problem, ProblemType};
use crate::address::CreatorAddress;

/// Ledger entries shown per creator (newest first).
pub const MAX_LEDGER_ENTRIES_SHOWN: i64 = 100;

/// True when the creator has a balance or an item in one of the last
/// [`MAX_LEDGER_ENTRIES_SHOWN`] periods. Each period is looked up by its
/// key `(period, creator)`: the tables are partitioned by period, and a
/// creator-only condition would read every partition's whole index.
pub async fn known(pool: &PgPool, creator: &CreatorAddress) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM settlement.creator_balance WHERE creator = $1)
             OR EXISTS (SELECT 1
                        FROM (SELECT period FROM settlement.settlement_policy ORDER BY period DESC LIMIT $2) p
                        JOIN LATERAL (SELECT 1 FROM settlement.token_trade_volume v
                                      WHERE v.period = p.period AND v.creator = $1) v ON true)",
    )
    .bind(creator.as_str())
    .bind(MAX_LEDGER_ENTRIES_SHOWN)
    .fetch_one(pool)
    .await
}

/// A creator as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Creator {
    /// The creator (lower case).
    pub creator: String,
    /// Its balance, in base units (a decimal string).
    pub balance: String,
    /// Its newest holds, newest first (at most 50).
    pub holds: Vec<CreatorHold>,
    /// Its ledger entries of the newest periods, newest first.
    pub ledger: Vec<LedgerEntry>,
}

/// A hold of a creator.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatorHold {
    /// Hold id.
    pub id: i64,
    /// Why.
    pub reason: String,
    /// When it was placed.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it was released (null while active).
    #[schema(required = true)]
    pub released_at: Option<chrono::DateTime<chrono::Utc>>,
    /// True until it is released.
    pub active: bool,
}

/// `GET /v1/creators/{address}`.
#[utoipa::path(get, path = "/v1/creators/{address}", operation_id = "get_creator", tag = TAG_CREATORS,
    summary = "A creator's balance, holds and ledger entries",
    params(("address" = CreatorAddress, Path, description = "the creator")),
    responses(
        (status = 200, description = "the creator", body = Creator),
        (status = 400, description = "not an address (invalid-address)"),
        (status = 404, description = "unknown creator (unknown-creator)"),
    ))]
pub async fn show(State(state): State<AppState>, Path(address): Path<String>) -> Result<Response, Problem> {
    let creator = CreatorAddress::parse(&address)
        .map_err(|e| Problem::bad_request(ProblemType::InvalidAddress, format!("address {e}")).field("address"))?;
    let pool = &state.reads;
    if !known(pool, &creator).await.map_err(Problem::unavailable)? {
        return Err(Problem::not_found(
            ProblemType::UnknownCreator,
            format!("creator {creator} is unknown"),
        ));
    }
    let balance: Option<String> =
        sqlx::query_scalar("SELECT balance::text FROM settlement.creator_balance WHERE creator = $1")
            .bind(creator.as_str())
            .fetch_optional(pool)
            .await
            .map_err(Problem::unavailable)?;
    let holds: Vec<crate::settlement::Hold> = sqlx::query_as(
        "SELECT id, creator, reason, created_at, released_at FROM settlement.creator_holds
         WHERE creator = $1 ORDER BY id DESC LIMIT 50",
    )
    .bind(creator.as_str())
    .fetch_all(pool)
    .await
    .map_err(Problem::unavailable)?;
    let ledger: Vec<LedgerEntry> = sqlx::query_as(
        "SELECT l.period, l.amount::text AS amount, l.run_id, l.created_at
         FROM (SELECT period FROM settlement.settlement_policy ORDER BY period DESC LIMIT $2) p
         JOIN LATERAL (SELECT * FROM settlement.reward_ledger l
                       WHERE l.period = p.period AND l.creator = $1) l ON true
         ORDER BY l.period DESC",
    )
    .bind(creator.as_str())
    .bind(MAX_LEDGER_ENTRIES_SHOWN)
    .fetch_all(pool)
    .await
    .map_err(Problem::unavailable)?;
    let body = Creator {
        creator: creator.as_str().to_string(),
        balance: balance.unwrap_or_else(|| "0".into()),
        holds: holds
            .into_iter()
            .map(|h| CreatorHold {
                active: h.released_at.is_none(),
                id: h.id,
                reason: h.reason,
                created_at: h.created_at,
                released_at: h.released_at,
            })
            .collect(),
        ledger,
    };
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// One ledger row of a creator, as the API shows it.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct LedgerEntry {
    /// The period it settles.
    pub period: chrono::NaiveDate,
    /// Base units credited (a decimal string).
    pub amount: String,
    /// The run that settled it.
    pub run_id: i64,
    /// When.
    pub created_at: chrono::DateTime<chrono::Utc>,
}
