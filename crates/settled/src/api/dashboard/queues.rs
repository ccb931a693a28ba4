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
use crate::api::{AppState, Problem, ProblemType};
use crate::queues::jobs::{self, JobState, JOBS_PAGE_MAX};
use crate::queues::{self, ReplayRequest, DEAD_LETTERS_SHOWN};

/// `GET /queues`.
pub(crate) async fn list(State(state): State<AppState>, watch: super::Watch) -> Page {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let views = queues::overview(&mut conn).await.map_err(Problem::unavailable)?;
    Ok(queue_pages::queues(&views, &watch))
}

/// Query of a queue's page: what the form just posted did, and which page
/// of one state's jobs to show (`state=`, `after=` the last key shown,
/// `limit=`; the other states show their first page).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ShowQuery {
    replayed: Option<u64>,
    state: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

/// Jobs of each state shown unless `limit=` says otherwise.
pub(crate) const JOBS_SHOWN_DEFAULT: i64 = 20;

impl ShowQuery {
    /// The state paged, its cursor and the page size; a field at fault is named.
    fn paging(&self) -> Result<(Option<JobState>, Option<&str>, i64), Problem> {
        let state = match self.state.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(JobState::parse(s).ok_or_else(|| {
                Problem::invalid(
                    "state",
                    format!("state must be ready, scheduled, processing or failed, not {s:?}"),
                )
            })?),
        };
        let limit = match self.limit.as_deref().filter(|s| !s.is_empty()) {
            None => JOBS_SHOWN_DEFAULT,
            Some(text) => text
                .parse()
                .ok()
                .filter(|n| (1..=JOBS_PAGE_MAX).contains(n))
                .ok_or_else(|| {
                    Problem::invalid(
                        "limit",
                        format!("limit must be an integer in 1..={JOBS_PAGE_MAX}, not {text:?}"),
                    )
                })?,
        };
        Ok((state, self.after.as_deref().filter(|a| !a.is_empty()), limit))
    }
}

/// `GET /queues/{name}`: its counts, pickup latency, dead letters, and the
/// jobs of each state, paged by keyset.
pub(crate) async fn show(State(state): State<AppState>, Path(name): Path<String>, Query(q): Query<ShowQuery>) -> Page {
    let paging = q.paging()?;
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let view = queues::view(&mut conn, &name).await.map_err(problem)?;
    let (dead, jobs) = match view.error {
        Some(_) => (None, Vec::new()),
        None => {
            let found = queues::find(&mut conn, &name).await.map_err(problem)?;
            let dead = queues::dead_letters(&mut conn, &found, DEAD_LETTERS_SHOWN)
                .await
                .map_err(problem)?;
            (Some(dead), jobs_by_state(&mut conn, &found, paging).await?)
        }
    };
    let pickup = crate::api::metrics::pickup_latency(&name);
    let shown = queue_pages::Shown {
        dead: dead.as_deref(),
        pickup: pickup.as_ref(),
        replayed: q.replayed,
        jobs: &jobs,
        limit: paging.2,
    };
    Ok(queue_pages::queue(&view, &shown))
}

/// The page of each state's jobs: the asked-for page of the paged state,
/// the first page of the others.
async fn jobs_by_state(
    conn: &mut sqlx::PgConnection,
    found: &queues::Found,
    (paged, after, limit): (Option<JobState>, Option<&str>, i64),
) -> Result<Vec<queue_pages::StateJobs>, Problem> {
    let mut all = Vec::new();
    for state in JobState::ALL {
        let after = after.filter(|_| paged == Some(state));
        let lines = jobs::list(conn, found, state, after, limit).await.map_err(problem)?;
        all.push(queue_pages::StateJobs {
            state,
            after: after.map(str::to_string),
            lines,
        });
    }
    Ok(all)
}

/// Workers of the registry searched for a job's lease holder (newest first).
pub(crate) const WORKERS_SEARCHED: i64 = 1000;

/// `GET /queues/{name}/jobs/{key}`: one job, its attempts, errors and lease.
pub(crate) async fn job(State(state): State<AppState>, Path((name, key)): Path<(String, String)>) -> Page {
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let found = queues::find(&mut conn, &name).await.map_err(problem)?;
    let job = jobs::one(&mut conn, &found, &key)
        .await
        .map_err(problem)?
        .ok_or_else(|| Problem::not_found(ProblemType::UnknownJob, format!("queue {name} has no job {key:?}")))?;
    let workers = settled_engine::raw::workers::list(&state.reads, None, WORKERS_SEARCHED)
        .await
        .map_err(Problem::unavailable)?;
    let holder = job
        .line
        .lease_owner
        .and_then(|owner| workers.into_iter().find(|w| w.id == owner));
    Ok(queue_pages::job(&name, &job, holder.as_ref()))
}

/// The replay form: one dead letter by key, or (no key) every one.
#[derive(Debug, Deserialize)]
pub(crate) struct ReplayForm {
    key: Option<String>,
}

/// `POST /dashboard/queues/{name}/replay`: then back to the queue's page,
/// which says how many were replayed.
pub(crate) async fn replay(
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
pub(crate) async fn pause(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    set_paused(&state, &name, true).await?;
    Ok(Redirect::to(&format!("/queues/{name}")).into_response())
}

/// `POST /dashboard/queues/{name}/resume`.
pub(crate) async fn resume(
    State(state): State<AppState>,
    _: DashboardAuthorized,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    set_paused(&state, &name, false).await?;
    Ok(Redirect::to(&format!("/queues/{name}")).into_response())
}
