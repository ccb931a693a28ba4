//! `GET /v1/creators/{address}`: balance, holds and ledger entries.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sqlx::PgPool;

use super::{AppState, Problem};
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

/// `GET /v1/creators/{address}`.
pub async fn show(State(state): State<AppState>, Path(address): Path<String>) -> Result<Response, Problem> {
    let creator = CreatorAddress::parse(&address)
        .map_err(|e| Problem::bad_request("invalid-address", format!("address {e}")).field("address"))?;
    let pool = &state.reads;
    if !known(pool, &creator).await.map_err(Problem::unavailable)? {
        return Err(Problem::not_found(
            "unknown-creator",
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
    let body = serde_json::json!({
        "creator": creator.as_str(),
        "balance": balance.unwrap_or_else(|| "0".into()),
        "holds": holds.iter().map(|h| serde_json::json!({
            "id": h.id, "reason": h.reason, "created_at": h.created_at, "released_at": h.released_at,
            "active": h.released_at.is_none(),
        })).collect::<Vec<_>>(),
        "ledger": ledger,
    });
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// One ledger row of a creator, as the API shows it.
#[derive(Debug, serde::Serialize, sqlx::FromRow)]
struct LedgerEntry {
    period: chrono::NaiveDate,
    amount: String,
    run_id: i64,
    created_at: chrono::DateTime<chrono::Utc>,
}
