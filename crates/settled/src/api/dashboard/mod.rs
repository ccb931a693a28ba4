//! The dashboard: server-rendered HTML (no JavaScript, no assets from the
//! internet), refreshed by the browser every few seconds. Every number comes
//! from an exact query on committed state (`queries.rs`); the pages are
//! maud templates that escape whatever they show (`pages.rs`); this file
//! only joins the two.

mod pages;
mod queries;

pub use pages::REFRESH_SECS;
pub use queries::{ITEMS_SHOWN, RUNS_SHOWN};

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::Markup;
use serde::Deserialize;
use settled_engine::{ItemStatus, RunState};

use super::{AppState, Problem};
use crate::period::Period;

/// What a dashboard handler returns: a page, or a problem.
type Page = Result<Markup, Problem>;

/// `GET /`: runs with progress, amounts, throughput and ETA.
pub async fn runs(State(state): State<AppState>) -> Page {
    let pool = &state.pool;
    let progress = queries::runs_with_progress(pool).await.map_err(Problem::unavailable)?;
    let mut shown = Vec::with_capacity(progress.len());
    let mut live: Option<(i64, Vec<queries::Second>)> = None;
    for p in progress {
        let mut eta = "-".to_string();
        if p.run.state == RunState::Running {
            let points = queries::throughput(pool, &p.run.scope).await.unwrap_or_default();
            let recent: Vec<&queries::Second> = points.iter().rev().take(10).collect();
            let rate = recent.iter().map(|s| s.settled).sum::<i64>() as f64 / recent.len().max(1) as f64;
            if rate > 0.0 {
                eta = format!("{:.0} s", (p.total - p.done) as f64 / rate);
            }
            if live.is_none() {
                live = Some((p.run.id, points));
            }
        }
        shown.push((p, eta));
    }
    Ok(pages::runs(
        &shown,
        live.as_ref().map(|(id, points)| (*id, points.as_slice())),
    ))
}

/// `GET /runs/{id}`: a run's report, its chart and its verification.
pub async fn run_report(State(state): State<AppState>, Path(id): Path<String>) -> Page {
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::bad_request("invalid-id", "run id must be an integer"))?;
    let pool = &state.pool;
    let run = crate::settlement::job()
        .get_run(pool, id)
        .await
        .map_err(Problem::unavailable)?
        .ok_or_else(|| Problem::not_found("unknown-run", format!("no run {id}")))?;
    let verified = match Period::parse(&run.scope) {
        Ok(period) => {
            let mut conn = pool.acquire().await.map_err(Problem::unavailable)?;
            crate::verify::verify(&mut conn, period)
                .await
                .map_err(|e| e.to_string())
        }
        Err(e) => Err(e),
    };
    let points = queries::throughput(pool, &run.scope).await.unwrap_or_default();
    Ok(pages::run_report(
        id,
        &run.scope,
        run.state.as_str(),
        verified.as_ref().map_err(Clone::clone),
        &points,
        run.report.as_ref(),
    ))
}

/// `GET /workers`.
pub async fn workers(State(state): State<AppState>) -> Page {
    let all = settled_engine::workers::list(&state.pool, Some(&crate::settlement::queue()), 100)
        .await
        .map_err(Problem::unavailable)?;
    Ok(pages::workers(&all))
}

/// Query of the items page.
#[derive(Debug, Deserialize)]
pub struct ItemsQuery {
    status: Option<String>,
}

/// `GET /items?status=failed|held`: with their errors and a retry action.
pub async fn items(State(state): State<AppState>, Query(q): Query<ItemsQuery>) -> Page {
    let status = match q.status.as_deref() {
        Some("held") => ItemStatus::Held,
        _ => ItemStatus::Failed,
    };
    let rows = queries::items(&state.pool, status)
        .await
        .map_err(Problem::unavailable)?;
    Ok(pages::items(status.as_str(), &rows))
}

/// The retry form.
#[derive(Debug, Deserialize)]
pub struct RetryForm {
    period: String,
    creator: String,
    token: String,
}

/// `POST /dashboard/retry`: puts a failed item back (API token required).
pub async fn retry(State(state): State<AppState>, Form(form): Form<RetryForm>) -> Result<Response, Problem> {
    super::auth::check_token(&state, &form.token)?;
    let period = Period::parse(&form.period).map_err(|_| Problem::invalid("period", "not a date"))?;
    let creator = crate::address::CreatorAddress::parse(&form.creator)
        .map_err(|_| Problem::invalid("creator", "not an address"))?;
    crate::settlement::retry_failed(&state.pool, period, Some(&creator))
        .await
        .map_err(Problem::unavailable)?;
    Ok(Redirect::to("/items?status=failed").into_response())
}

/// `GET /locks`: who holds which lock on the settlement and engine tables,
/// and who waits for whom.
pub async fn locks(State(state): State<AppState>) -> Page {
    let rows = queries::locks(&state.pool).await.map_err(Problem::unavailable)?;
    Ok(pages::locks(&rows))
}
