//! The dashboard's continuous queues: `/queues` (every registered queue's
//! counts and oldest ready age) and `/queues/{name}` (its counts, the
//! pickup latency this server measured, dead letters with a replay form,
//! pause or resume), and the forms' routes. The forms authenticate as the
//! retry form does ([`DashboardAuthorized`]: the token in the request's
//! head, checked before the form is read; a form from another origin is
//! refused), and run the API's own transactions.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{queue_pages, Page};
use crate::api::auth::DashboardAuthorized;
use crate::api::queues::{problem, replay_committed, set_paused};
use crate::api::{AppState, Problem};
use crate::queues::{self, ReplayRequest, DEAD_LETTERS_SHOWN};

/// `GET /queues`.
pub async fn list(State(state): State<AppState>, watch: super::Watch) -> Page {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let views = queues::overview(&mut conn).await.map_err(Problem::unavailable)?;
    Ok(queue_pages::queues(&views, &watch))
}

/// Query of a queue's page: what the form just posted did.
#[derive(Debug, Deserialize)]
pub struct ShowQuery {
    replayed: Option<u64>,
}

/// `GET /queues/{name}`.
pub async fn show(State(state): State<AppState>, Path(name): Path<String>, Query(q): Query<ShowQuery>) -> Page {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let view = queues::view(&mut conn, &name).await.map_err(problem)?;
    let dead = match view.error {
        Some(_) => None,
        None => {
            let found = queues::find(&mut conn, &name).await.map_err(problem)?;
            Some(
                queues::dead_letters(&mut conn, &found, DEAD_LETTERS_SHOWN)
                    .await
                    .map_err(problem)?,
            )
        }
    };
    let pickup = crate::api::metrics::pickup_latency(&name);
    Ok(queue_pages::queue(&view, dead.as_deref(), pickup.as_ref(), q.replayed))
}

/// The replay form: one dead letter by key, or (no key) every one.
#[derive(Debug, Deserialize)]
pub struct ReplayForm {
    key: Option<String>,
}

/// `POST /dashboard/queues/{name}/replay`: then back to the queue's page,
/// which says how many were replayed.
pub async fn replay(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let form: ReplayForm = crate::api::read_form(&headers, body).await?;
    let request = ReplayRequest {
        key: form.key.filter(|k| !k.is_empty()),
        ..ReplayRequest::default()
    };
    let filter = request
        .filter()
        .map_err(|e| Problem::invalid(e.field, e.named(e.field)))?;
    let replayed = replay_committed(&state, &name, &filter).await?;
    Ok(Redirect::to(&format!("/queues/{name}?replayed={replayed}")).into_response())
}

/// `POST /dashboard/queues/{name}/pause`.
pub async fn pause(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    set_paused(&state, &name, true).await?;
    Ok(Redirect::to(&format!("/queues/{name}")).into_response())
}

/// `POST /dashboard/queues/{name}/resume`.
pub async fn resume(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    set_paused(&state, &name, false).await?;
    Ok(Redirect::to(&format!("/queues/{name}")).into_response())
}
