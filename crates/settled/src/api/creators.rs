//! `GET /v1/creators/{address}`: balances, holds and ledger entries, and
//! `GET /v1/creators/{address}/statement`: what moved the balance, paged.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use utoipa::ToSchema;

use super::openapi::TAG_CREATORS;
use super::{AppState, Problem, ProblemType};
use crate::address::CreatorAddress;
use crate::balance::{self, Balances, Cursor, Statement, Window, MAX_STATEMENT_PAGE, STATEMENT_PAGE};

/// Ledger entries shown per creator (newest first).
pub(crate) const MAX_LEDGER_ENTRIES_SHOWN: i64 = 100;

/// True when the creator has a balance or an item in one of the last
/// [`MAX_LEDGER_ENTRIES_SHOWN`] periods. Each period is looked up by its
/// key `(period, creator)`: the tables are partitioned by period, and a
/// creator-only condition would read every partition's whole index.
pub(crate) async fn known(pool: &PgPool, creator: &CreatorAddress) -> Result<bool, sqlx::Error> {
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

/// A read connection for a creator the API knows; 404 `unknown-creator`
/// for one it does not.
async fn known_reads(state: &AppState, creator: &CreatorAddress) -> Result<PoolConnection<Postgres>, Problem> {
    let pool = &state.reads;
    if !known(pool, creator).await.map_err(Problem::unavailable)? {
        return Err(Problem::not_found(
            ProblemType::UnknownCreator,
            format!("creator {creator} is unknown"),
        ));
    }
    pool.acquire().await.map_err(Problem::unavailable)
}

/// A creator as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Creator {
    /// The creator (lower case).
    pub creator: String,
    /// Its balance row, in base units (a decimal string): posted less
    /// pending.
    pub balance: String,
    /// Posted, pending and available.
    pub balances: Balances,
    /// Its newest holds, newest first (at most 50).
    pub holds: Vec<CreatorHold>,
    /// Its ledger entries of the newest periods, newest first.
    pub ledger: Vec<LedgerEntry>,
}

/// A hold of a creator.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CreatorHold {
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

/// Holds shown per creator (newest first).
pub(crate) const HOLDS_SHOWN: i64 = 50;

/// The newest [`HOLDS_SHOWN`] holds of `creator`, newest first.
pub(crate) async fn holds(pool: &PgPool, creator: &CreatorAddress) -> Result<Vec<CreatorHold>, sqlx::Error> {
    let holds: Vec<crate::settlement::Hold> = sqlx::query_as(
        "SELECT id, creator, reason, created_at, released_at FROM settlement.creator_holds
         WHERE creator = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(creator.as_str()) // $1
    .bind(HOLDS_SHOWN) // $2
    .fetch_all(pool)
    .await?;
    Ok(holds
        .into_iter()
        .map(|h| CreatorHold {
            active: h.released_at.is_none(),
            id: h.id,
            reason: h.reason,
            created_at: h.created_at,
            released_at: h.released_at,
        })
        .collect())
}

/// `GET /v1/creators/{address}`.
#[utoipa::path(get, path = "/v1/creators/{address}", operation_id = "get_creator", tag = TAG_CREATORS,
    summary = "A creator's balances (posted, pending, available), holds and ledger entries",
    params(("address" = CreatorAddress, Path, description = "the creator")),
    responses(
        (status = 200, description = "the creator", body = Creator),
        (status = 400, description = "not an address (invalid-address)"),
        (status = 404, description = "unknown creator (unknown-creator)"),
    ))]
pub(crate) async fn show(State(state): State<AppState>, Path(address): Path<String>) -> Result<Response, Problem> {
    let creator = CreatorAddress::parse(&address)
        .map_err(|e| Problem::bad_request(ProblemType::InvalidAddress, format!("address {e}")).field("address"))?;
    let mut conn = known_reads(&state, &creator).await?;
    let (balance, balances) = balance::balances(&mut conn, &creator)
        .await
        .map_err(Problem::unavailable)?
        .unwrap_or_else(|| ("0".into(), Balances::default()));
    drop(conn);
    let pool = &state.reads;
    let holds = holds(pool, &creator).await.map_err(Problem::unavailable)?;
    let ledger = ledger(pool, &creator).await.map_err(Problem::unavailable)?;
    let body = Creator {
        creator: creator.as_str().to_string(),
        balance,
        balances,
        holds,
        ledger,
    };
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// A creator's ledger rows of the newest [`MAX_LEDGER_ENTRIES_SHOWN`]
/// periods, newest first, each looked up by its key.
pub(crate) async fn ledger(pool: &PgPool, creator: &CreatorAddress) -> Result<Vec<LedgerEntry>, sqlx::Error> {
    sqlx::query_as(
        "SELECT l.period, l.amount::text AS amount, l.run_id, l.created_at
         FROM (SELECT period FROM settlement.settlement_policy ORDER BY period DESC LIMIT $2) p
         JOIN LATERAL (SELECT * FROM settlement.reward_ledger l
                       WHERE l.period = p.period AND l.creator = $1) l ON true
         ORDER BY l.period DESC",
    )
    .bind(creator.as_str()) // $1
    .bind(MAX_LEDGER_ENTRIES_SHOWN) // $2
    .fetch_all(pool)
    .await
}

/// One ledger row of a creator, as the API shows it.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub(crate) struct LedgerEntry {
    /// The period it settles.
    pub period: chrono::NaiveDate,
    /// Base units credited (a decimal string).
    pub amount: String,
    /// The run that settled it.
    pub run_id: i64,
    /// When.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Query of a statement.
#[derive(Debug, Deserialize)]
pub(crate) struct StatementQuery {
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
    after: Option<String>,
}

/// `GET /v1/creators/{address}/statement?from=&to=&limit=&after=`.
#[utoipa::path(get, path = "/v1/creators/{address}/statement", operation_id = "get_creator_statement",
    tag = TAG_CREATORS,
    summary = "What moved a creator's balance: credits, payouts, returns and holds, oldest first, with the running balance",
    params(
        ("address" = CreatorAddress, Path, description = "the creator"),
        ("from" = Option<String>, Query, description = "first instant, inclusive: RFC 3339 (`2026-12-01T00:00:00Z`) or a date (`2026-12-01`, its midnight UTC)"),
        ("to" = Option<String>, Query, description = "last instant, exclusive: RFC 3339 or a date"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "lines per page (100 by default)"),
        ("after" = Option<String>, Query, description = "the previous page's `next`"),
    ),
    responses(
        (status = 200, description = "a page of the statement", body = Statement),
        (status = 400, description = "not an address (invalid-address), a bad from, to or after (invalid-field), limit not 1..=1000 (invalid-limit), or a query parameter named twice"),
        (status = 404, description = "unknown creator (unknown-creator)"),
    ))]
pub(crate) async fn statement(
    State(state): State<AppState>,
    Path(address): Path<String>,
    Query(q): Query<StatementQuery>,
) -> Result<Response, Problem> {
    let creator = CreatorAddress::parse(&address)
        .map_err(|e| Problem::bad_request(ProblemType::InvalidAddress, format!("address {e}")).field("address"))?;
    let window = Window {
        from: q.from.as_deref().map(|t| instant("from", t)).transpose()?,
        to: q.to.as_deref().map(|t| instant("to", t)).transpose()?,
        after: q
            .after
            .as_deref()
            .map(|t| {
                Cursor::decode(t).ok_or_else(|| {
                    Problem::bad_request(
                        ProblemType::InvalidField,
                        format!("after must be a statement's `next`, not {t:?}"),
                    )
                    .field("after")
                })
            })
            .transpose()?,
    };
    let limit = match q.limit.as_deref() {
        None => STATEMENT_PAGE,
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_STATEMENT_PAGE).contains(n))
            .ok_or_else(|| {
                Problem::bad_request(
                    ProblemType::InvalidLimit,
                    format!("limit must be an integer 1..={MAX_STATEMENT_PAGE}, not {text:?}"),
                )
                .field("limit")
            })?,
    };
    let mut conn = known_reads(&state, &creator).await?;
    let page: Statement = balance::statement(&mut conn, &creator, window, limit)
        .await
        .map_err(Problem::unavailable)?;
    Ok((StatusCode::OK, axum::Json(page)).into_response())
}

/// An instant of a query: RFC 3339, or a date (its midnight UTC).
pub(crate) fn instant(field: &'static str, text: &str) -> Result<chrono::DateTime<chrono::Utc>, Problem> {
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&chrono::Utc));
    }
    if let Ok(day) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        if let Some(midnight) = day.and_hms_opt(0, 0, 0) {
            return Ok(midnight.and_utc());
        }
    }
    Err(Problem::bad_request(
        ProblemType::InvalidField,
        format!("{field} must be an RFC 3339 instant (2026-12-01T00:00:00Z) or a date (2026-12-01), not {text:?}"),
    )
    .field(field))
}
