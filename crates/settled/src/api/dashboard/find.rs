//! Finding a payout or a hold from the dashboard: the payouts list's query,
//! a payout's page with its cancel form, the holds page with its place and
//! release forms. Forms are authenticated as the retry form is
//! ([`DashboardAuthorized`]) and act through the API's own functions.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{hold_pages, payout_pages, Page};
use crate::api::auth::DashboardAuthorized;
use crate::api::{AppState, Problem, ProblemType};
use crate::payouts::find::{self, Filter, PAGE_ROWS_DEFAULT, PAGE_ROWS_MAX};
use crate::payouts::PayoutState;

/// The query of `/payouts`: every field optional; an empty one (as a form
/// sends it) is no filter.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct PayoutsQuery {
    status: Option<String>,
    creator: Option<String>,
    id: Option<String>,
    from: Option<String>,
    to: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

fn whole(field: &'static str, text: &str) -> Result<i64, Problem> {
    text.parse::<i64>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| Problem::invalid(field, format!("{field} must be a positive integer, not {text:?}")))
}

impl PayoutsQuery {
    /// The filter and page size it asks for; a field at fault is named.
    pub(crate) fn filter(&self) -> Result<(Filter, i64), Problem> {
        let status = given(&self.status)
            .map(|s| {
                PayoutState::parse(s)
                    .ok_or_else(|| Problem::invalid("status", format!("status must be a payout state, not {s:?}")))
            })
            .transpose()?;
        let creator = given(&self.creator)
            .map(|c| {
                crate::address::CreatorAddress::parse(c)
                    .map_err(|e| Problem::invalid("creator", format!("creator {e}")))
            })
            .transpose()?;
        let id = given(&self.id).map(|t| whole("id", t)).transpose()?;
        let from = given(&self.from)
            .map(|t| crate::api::creators::instant("from", t))
            .transpose()?;
        let to = given(&self.to)
            .map(|t| crate::api::creators::instant("to", t))
            .transpose()?;
        let after = given(&self.after).map(|t| whole("after", t)).transpose()?;
        let limit = given(&self.limit).map(|t| whole("limit", t)).transpose()?;
        if limit.is_some_and(|n| n > PAGE_ROWS_MAX) {
            return Err(Problem::invalid("limit", format!("limit must be 1..={PAGE_ROWS_MAX}")));
        }
        let filter = Filter {
            status,
            creator,
            id,
            from,
            to,
            after,
        };
        Ok((filter, limit.unwrap_or(PAGE_ROWS_DEFAULT)))
    }

    /// The fields as given, for the form and the next page's link.
    pub(crate) fn given(&self) -> Vec<(&'static str, String)> {
        [
            ("status", &self.status),
            ("creator", &self.creator),
            ("id", &self.id),
            ("from", &self.from),
            ("to", &self.to),
            ("limit", &self.limit),
        ]
        .into_iter()
        .map(|(k, v)| (k, given(v).unwrap_or("").to_string()))
        .collect()
    }
}

/// `GET /payouts/{id}`: one payout and everything that happened to it.
pub(crate) async fn payout(State(state): State<AppState>, Path(id): Path<String>) -> Page {
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::bad_request(ProblemType::InvalidId, "payout id must be an integer").field("id"))?;
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let detail = find::detail(&mut conn, id)
        .await
        .map_err(Problem::unavailable)?
        .ok_or_else(|| Problem::not_found(ProblemType::UnknownPayout, format!("no payout {id}")))?;
    let chain_txs = crate::chain::listing::of_payout(&mut conn, id)
        .await
        .map_err(Problem::unavailable)?;
    Ok(payout_pages::payout(&detail, &chain_txs, state.decimals))
}

/// The query of `/chain`: the page before a transaction id, one
/// transaction alone, how many per page.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChainQuery {
    before: Option<String>,
    tx: Option<String>,
    limit: Option<String>,
}

/// `GET /chain`: the chain rail's transactions, newest first, paged by
/// keyset, each with its attempts, its block and the payouts it pays.
pub(crate) async fn chain(State(state): State<AppState>, Query(q): Query<ChainQuery>, watch: super::Watch) -> Page {
    use crate::chain::listing::{self, TXS_PER_PAGE_DEFAULT, TXS_PER_PAGE_MAX};
    let before = given(&q.before).map(|t| whole("before", t)).transpose()?;
    let only = given(&q.tx).map(|t| whole("tx", t)).transpose()?;
    let limit = given(&q.limit).map(|t| whole("limit", t)).transpose()?;
    if limit.is_some_and(|n| n > TXS_PER_PAGE_MAX) {
        return Err(Problem::invalid(
            "limit",
            format!("limit must be 1..={TXS_PER_PAGE_MAX}"),
        ));
    }
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let found = listing::page(&mut conn, before, only, limit.unwrap_or(TXS_PER_PAGE_DEFAULT))
        .await
        .map_err(Problem::unavailable)?;
    Ok(super::chain_pages::chain(&found, &watch))
}

/// `POST /dashboard/payouts/{id}/cancel`: cancels a payout awaiting its
/// confirmation (as `POST /v1/payouts/{id}/cancel` does), then shows it.
pub(crate) async fn cancel_payout(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::bad_request(ProblemType::InvalidId, "payout id must be an integer").field("id"))?;
    crate::api::payouts::cancel_by_id(&state, id).await?;
    Ok(Redirect::to(&format!("/payouts/{id}")).into_response())
}

/// Active holds shown on `/holds`.
pub(crate) const HOLDS_SHOWN: i64 = 500;

/// `GET /holds`: the active holds with reason and age, a form that places
/// one, and a release form on each.
pub(crate) async fn holds(State(state): State<AppState>) -> Page {
    let active: Vec<(crate::settlement::Hold, f64)> = sqlx::query_as::<_, HoldAge>(
        "SELECT id, creator, reason, created_at, released_at,
                extract(epoch FROM now() - created_at)::float8 AS age_secs
         FROM settlement.creator_holds WHERE released_at IS NULL ORDER BY created_at, id LIMIT $1",
    )
    .bind(HOLDS_SHOWN) // $1
    .fetch_all(&state.reads)
    .await
    .map_err(Problem::unavailable)?
    .into_iter()
    .map(|h| (h.hold, h.age_secs))
    .collect();
    Ok(hold_pages::holds(&active))
}

#[derive(sqlx::FromRow)]
struct HoldAge {
    #[sqlx(flatten)]
    hold: crate::settlement::Hold,
    age_secs: f64,
}

/// The form that places a hold.
#[derive(Debug, Deserialize)]
pub(crate) struct PlaceForm {
    creator: String,
    reason: String,
}

/// `POST /dashboard/holds`: places a hold (as `POST /v1/holds` does).
pub(crate) async fn place_hold(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, Problem> {
    let form: PlaceForm = crate::api::read_form(&headers, body).await?;
    let request = crate::api::holds::HoldRequest {
        creator: form.creator,
        reason: form.reason,
    };
    crate::api::holds::place(&state, &request).await?;
    Ok(Redirect::to("/holds").into_response())
}

/// The release form: the page to go back to (`holds`, or a creator's).
#[derive(Debug, Deserialize)]
pub(crate) struct ReleaseForm {
    from: Option<String>,
}

/// `POST /dashboard/holds/{id}/release`: releases a hold (as `POST
/// /v1/holds/{id}/release` does).
pub(crate) async fn release_hold(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, Problem> {
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::bad_request(ProblemType::InvalidId, "hold id must be an integer").field("id"))?;
    let form: ReleaseForm = crate::api::read_form(&headers, body).await?;
    let hold = crate::api::holds::release_by_id(&state, id).await?;
    let back = match form.from.as_deref() {
        Some("creator") => format!("/creators/{}", hold.creator),
        _ => "/holds".to_string(),
    };
    Ok(Redirect::to(&back).into_response())
}
