//! The dashboard: server-rendered HTML (no JavaScript, no assets from the
//! internet), refreshed by the browser every few seconds. Every number comes
//! from an exact query on committed state (`queries.rs`); the pages are
//! maud templates that escape whatever they show (`pages.rs`); this file
//! only joins the two.

pub(crate) mod audit_page;
mod chain_pages;
mod creator_pages;
pub(crate) mod find;
mod hold_pages;
mod pages;
mod payout_pages;
pub(crate) mod queries;
mod queue_pages;
pub(crate) mod queues;
pub(crate) mod sql_text;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::Markup;
use serde::Deserialize;
use settled_engine::{ItemStatus, RunState};

use super::{AppState, Problem, ProblemType};
use crate::period::Period;
use crate::run_state::Shown;
use crate::verify::VerifyReport;

/// What a dashboard handler returns: a page, or a problem.
type Page = Result<Markup, Problem>;

/// `GET /`: runs with progress, amounts, throughput and ETA; a running run
/// without a live worker is `stalled`, with no ETA.
pub(crate) async fn runs(State(state): State<AppState>, watch: Watch) -> Page {
    let pool = &state.reads;
    let progress = queries::runs_with_progress(pool).await.map_err(Problem::unavailable)?;
    let workers = crate::run_state::workers(pool).await.map_err(Problem::unavailable)?;
    let mut shown = Vec::with_capacity(progress.len());
    let mut live: Option<(i64, Vec<queries::Second>)> = None;
    for p in progress {
        let run_shown = Shown::of(&p.run, &workers);
        let mut eta = "-".to_string();
        if run_shown == Shown::Stored(RunState::Running) {
            let points = queries::throughput(pool, &p.run.scope, p.total)
                .await
                .unwrap_or_default();
            let recent: Vec<&queries::Second> = points.iter().rev().take(10).collect();
            let rate = recent.iter().map(|s| s.settled).sum::<i64>() as f64 / recent.len().max(1) as f64;
            if rate > 0.0 {
                eta = format!("{:.0} s", (p.total - p.done) as f64 / rate);
            }
            if live.is_none() {
                live = Some((p.run.id, points));
            }
        }
        shown.push(pages::ShownRun {
            progress: p,
            shown: run_shown,
            eta,
        });
    }
    Ok(pages::runs(
        &shown,
        live.as_ref().map(|(id, points)| (*id, points.as_slice())),
        state.decimals,
        &watch,
    ))
}

/// Periods with more items than this are not verified on the run page (the
/// page says to run `settled verify`): at two million verify takes about
/// 9 s on two cores.
pub(crate) const PAGE_VERIFY_MAX_ITEMS: i64 = 2_000_000;

/// How long a run's verification is shown before a request computes it
/// again.
pub(crate) const VERIFY_INTERVAL: Duration = Duration::from_secs(15);

/// Verifications of runs, one per run, computed at most once per
/// [`VERIFY_INTERVAL`] however many pages ask (they wait for the one
/// computing it and share its result).
#[derive(Default)]
pub struct Verifications {
    runs: std::sync::Mutex<HashMap<i64, Arc<tokio::sync::Mutex<Option<Verified>>>>>,
}

/// A verification and when it was computed.
#[derive(Clone)]
pub(crate) struct Verified {
    /// When it was computed.
    pub at: Instant,
    /// The report, or why it could not run.
    pub result: Result<VerifyReport, String>,
}

/// Runs kept in [`Verifications`] before unused ones are dropped.
const VERIFICATIONS_KEPT: usize = 64;

impl Verifications {
    /// The verification of run `id` over `scope`, computed now if the last
    /// one is older than [`VERIFY_INTERVAL`].
    pub(crate) async fn get(&self, pool: &sqlx::PgPool, id: i64, scope: &str) -> Verified {
        let slot = {
            let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
            if runs.len() >= VERIFICATIONS_KEPT {
                runs.retain(|_, slot| Arc::strong_count(slot) > 1);
            }
            runs.entry(id).or_default().clone()
        };
        let mut slot = slot.lock().await;
        if let Some(done) = slot.as_ref().filter(|v| v.at.elapsed() < VERIFY_INTERVAL) {
            return done.clone();
        }
        metrics::counter!("settled_dashboard_verifications_total").increment(1);
        let result = match Period::parse(scope) {
            Ok(period) => crate::verify::verify_pool(pool, period)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let done = Verified {
            at: Instant::now(),
            result,
        };
        *slot = Some(done.clone());
        done
    }
}

/// `GET /runs/{id}`: a run's state (`stalled` derived) and progress, its
/// stored report, its chart and its verification (shared, at most
/// [`VERIFY_INTERVAL`] old).
pub(crate) async fn run_report(State(state): State<AppState>, Path(id): Path<String>, watch: Watch) -> Page {
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::bad_request(ProblemType::InvalidId, "run id must be an integer").field("id"))?;
    let pool = &state.reads;
    let run = crate::settlement::job()
        .get_run(pool, id)
        .await
        .map_err(Problem::unavailable)?
        .ok_or_else(|| Problem::not_found(ProblemType::UnknownRun, format!("no run {id}")))?;
    let workers = crate::run_state::workers(pool).await.map_err(Problem::unavailable)?;
    let (items, progress) = match queries::StoredReport::of(&run) {
        Some(stored) => (stored.counts.total(), None),
        None => {
            let counts = crate::settlement::queue()
                .count_by_status(&mut *pool.acquire().await.map_err(Problem::unavailable)?, &run.scope)
                .await
                .map_err(Problem::unavailable)?;
            let done = counts.counts.iter().filter(|(s, _)| s.is_final()).map(|(_, n)| n).sum();
            let progress = (run.state == RunState::Running).then_some((done, counts.total()));
            (counts.total(), progress)
        }
    };
    let verified = if items > PAGE_VERIFY_MAX_ITEMS {
        // verify is linear (about 35 s at 10 million here): longer than a
        // page may take. The command runs it, with no time limit.
        Verified {
            at: Instant::now(),
            result: Err(format!(
                "not run on the page for {items} items (more than {PAGE_VERIFY_MAX_ITEMS}); run `settled verify --period {}`",
                run.scope
            )),
        }
    } else {
        state.verifications.get(pool, id, &run.scope).await
    };
    let points = queries::throughput(pool, &run.scope, items).await.unwrap_or_default();
    let view = pages::RunView {
        id,
        period: &run.scope,
        shown: Shown::of(&run, &workers),
        progress,
        report: run.report.as_ref(),
    };
    Ok(pages::run_report(&view, &verified, &points, &watch))
}

/// `GET /workers`: the registry; a dead worker's row shows beside its last
/// heartbeat's counters what the ledger committed for the runs it lived
/// through.
pub(crate) async fn workers(State(state): State<AppState>, watch: Watch) -> Page {
    let all = settled_engine::raw::workers::list(&state.reads, Some(&crate::settlement::queue()), 100)
        .await
        .map_err(Problem::unavailable)?;
    let committed = queries::committed_by_dead_workers(&state.reads, &all)
        .await
        .map_err(Problem::unavailable)?;
    Ok(pages::workers(&all, &committed, &watch))
}

/// Conflicts and unknown provider events listed on the payouts page (the
/// newest; the page counts them all).
pub(crate) const PAYOUT_ISSUES_SHOWN: i64 = 50;

/// `GET /payouts`: payouts by state with amounts and ages, then the
/// payouts themselves, newest first, filtered and paged by keyset; returns,
/// conflicts, provider events for unknown payouts, and provider keys
/// waiting for an operator.
pub(crate) async fn payouts(State(state): State<AppState>, Query(q): Query<find::PayoutsQuery>, watch: Watch) -> Page {
    use crate::payouts::overview;
    let (filter, limit) = q.filter()?;
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let summary = overview::overview(&mut conn).await.map_err(Problem::unavailable)?;
    let found = crate::payouts::find::list(&mut conn, &filter, limit)
        .await
        .map_err(Problem::unavailable)?;
    let conflicts = overview::conflicts(&mut conn, PAYOUT_ISSUES_SHOWN)
        .await
        .map_err(Problem::unavailable)?;
    let unknown = overview::unknown_events(&mut conn, PAYOUT_ISSUES_SHOWN)
        .await
        .map_err(Problem::unavailable)?;
    let awaiting = overview::keys_awaiting_operator(&mut conn, PAYOUT_ISSUES_SHOWN)
        .await
        .map_err(Problem::unavailable)?;
    let issues = payout_pages::Issues {
        conflicts: &conflicts,
        unknown: &unknown,
        awaiting: &awaiting,
    };
    let listed = payout_pages::Listed {
        page: &found,
        query: &q.given(),
    };
    Ok(payout_pages::payouts(
        &summary,
        &issues,
        &listed,
        state.decimals,
        &watch,
    ))
}

/// A creator's newest payouts shown on its page (the rest: `/payouts?creator=`).
pub(crate) const CREATOR_PAYOUTS_SHOWN: i64 = 20;

/// Query of a creator's page: the statement page after this cursor.
#[derive(Debug, Deserialize)]
pub(crate) struct CreatorQuery {
    after: Option<String>,
}

/// `GET /creators/{address}`: a creator's balances, holds and statement.
pub(crate) async fn creator(
    State(state): State<AppState>,
    Path(address): Path<String>,
    Query(q): Query<CreatorQuery>,
) -> Page {
    use crate::address::CreatorAddress;
    use crate::balance::{self, Cursor, Window, STATEMENT_PAGE};
    let creator = CreatorAddress::parse(&address)
        .map_err(|e| Problem::bad_request(ProblemType::InvalidAddress, format!("address {e}")).field("address"))?;
    let after = match q.after.as_deref() {
        None => None,
        Some(text) => Some(Cursor::decode(text).ok_or_else(|| {
            Problem::bad_request(
                ProblemType::InvalidField,
                format!("after must be a statement's `next`, not {text:?}"),
            )
            .field("after")
        })?),
    };
    if !super::creators::known(&state.reads, &creator)
        .await
        .map_err(Problem::unavailable)?
    {
        return Err(Problem::not_found(
            ProblemType::UnknownCreator,
            format!("creator {creator} is unknown"),
        ));
    }
    let holds = super::creators::holds(&state.reads, &creator)
        .await
        .map_err(Problem::unavailable)?;
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let (_, balances) = balance::balances(&mut conn, &creator)
        .await
        .map_err(Problem::unavailable)?
        .unwrap_or_default();
    let window = Window {
        after,
        ..Window::default()
    };
    let statement = balance::statement(&mut conn, &creator, window, STATEMENT_PAGE)
        .await
        .map_err(Problem::unavailable)?;
    let filter = crate::payouts::find::Filter {
        creator: Some(creator.clone()),
        ..Default::default()
    };
    let payouts = crate::payouts::find::list(&mut conn, &filter, CREATOR_PAYOUTS_SHOWN)
        .await
        .map_err(Problem::unavailable)?;
    let verdict = crate::verify::creator_verdict(&mut conn, &creator)
        .await
        .map_err(Problem::unavailable)?;
    drop(conn);
    let ledger = super::creators::ledger(&state.reads, &creator)
        .await
        .map_err(Problem::unavailable)?;
    let shown = creator_pages::CreatorView {
        creator: creator.as_str(),
        balances: &balances,
        holds: &holds,
        ledger: &ledger,
        payouts: &payouts,
        verdict: &verdict,
        statement: &statement,
    };
    Ok(creator_pages::creator(&shown, state.decimals))
}

/// Query of the creator look-up form.
#[derive(Debug, Deserialize)]
pub(crate) struct CreatorLookup {
    address: Option<String>,
}

/// `GET /creators?address=0x…`: the look-up form's answer, a redirect to
/// the creator's page.
pub(crate) async fn find_creator(Query(q): Query<CreatorLookup>) -> Result<Redirect, Problem> {
    use crate::address::CreatorAddress;
    let text = q.address.unwrap_or_default();
    let creator = CreatorAddress::parse(text.trim())
        .map_err(|e| Problem::bad_request(ProblemType::InvalidAddress, format!("address {e}")).field("address"))?;
    Ok(Redirect::to(&format!("/creators/{creator}")))
}

/// Query of the items page.
#[derive(Debug, Deserialize)]
pub(crate) struct ItemsQuery {
    status: Option<String>,
}

/// `GET /items?status=failed|held`: with their errors and a retry action.
pub(crate) async fn items(State(state): State<AppState>, Query(q): Query<ItemsQuery>) -> Page {
    let status = match q.status.as_deref() {
        Some("held") => ItemStatus::Held,
        _ => ItemStatus::Failed,
    };
    let rows = queries::items(&state.reads, status)
        .await
        .map_err(Problem::unavailable)?;
    Ok(pages::items(status.as_str(), &rows))
}

/// The retry form.
#[derive(Debug, Deserialize)]
pub(crate) struct RetryForm {
    period: String,
    creator: String,
}

/// `POST /dashboard/retry`: puts a failed item back. The API token comes in
/// the request's head (Basic, as a browser sends it, or Bearer), checked
/// before the form is read; the form is read only as
/// `application/x-www-form-urlencoded`, at most the API's body limit and
/// time; a field at fault is named.
pub(crate) async fn retry(
    State(state): State<AppState>,
    _: super::auth::DashboardAuthorized,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Response, Problem> {
    let form: RetryForm = super::read_form(&headers, body).await?;
    let period =
        Period::parse(&form.period).map_err(|_| Problem::invalid("period", "period must be a date, YYYY-MM-DD"))?;
    let creator = crate::address::CreatorAddress::parse(&form.creator)
        .map_err(|e| Problem::invalid("creator", format!("creator {e}")))?;
    let retried: anyhow::Result<u64> = async {
        let mut tx = super::begin(&state).await?;
        let n = crate::settlement::retry_failed(&mut tx, period, Some(&creator)).await?;
        super::audit::set_target(format!("period {period} creator {creator}"));
        super::audit::set_outcome(format!("{} {n} item(s) retried", crate::audit::OK));
        super::commit(&state, tx).await?;
        Ok(n)
    }
    .await;
    retried.map_err(Problem::unavailable)?;
    Ok(Redirect::to("/items?status=failed").into_response())
}

/// Characters of a query shown in the lock view.
pub(crate) const QUERY_CHARS_SHOWN: usize = 200;

/// `GET /locks`: who holds which lock on the settlement and engine tables,
/// and who waits for whom. Other sessions' query text can hold secrets (a
/// `PASSWORD '...'`, a customer's data): it is shown with its literals
/// replaced by `?`, and whole only to an operator's or an admin's token.
pub(crate) async fn locks(
    State(state): State<AppState>,
    actor: Option<axum::Extension<super::auth::Actor>>,
    watch: Watch,
) -> Page {
    let mut rows = queries::locks(&state.reads).await.map_err(Problem::unavailable)?;
    let whole = actor.is_some_and(|a| a.role >= super::auth::Role::Operator);
    for row in &mut rows {
        // Literals go before the text is cut, so no half literal shows.
        row.query = row.query.as_deref().map(|q| {
            let q = if whole {
                q.to_string()
            } else {
                sql_text::without_literals(q)
            };
            q.chars().take(QUERY_CHARS_SHOWN).collect()
        });
    }
    Ok(pages::locks(&rows, whole, &watch))
}

/// Whether a page that watches something refreshes itself (yes, unless the
/// query says `refresh=off`), and where it is, for the link that stops or
/// starts it. Any query of the page is kept.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    /// True: the page refreshes every [`REFRESH_SECS`](pages::REFRESH_SECS).
    pub on: bool,
    path: String,
    /// The query's pairs, `refresh` left out.
    rest: Vec<(String, String)>,
}

impl Watch {
    /// The same page with refreshing turned the other way.
    pub(crate) fn toggle(&self) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.extend_pairs(&self.rest);
        if self.on {
            query.append_pair("refresh", "off");
        }
        let query = query.finish();
        if query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{query}", self.path)
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Watch {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Watch, Self::Rejection> {
        let pairs = form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()).into_owned();
        let (refresh, rest): (Vec<_>, Vec<_>) = pairs.partition(|(k, _)| k == "refresh");
        Ok(Watch {
            on: !refresh.iter().any(|(_, v)| v == "off"),
            path: parts.uri.path().to_string(),
            rest,
        })
    }
}

/// Answers a browser's request for a dashboard address with an HTML page
/// and the navigation whatever the status (404 included): a problem+json
/// error is rendered as a page, its status and headers kept (a 401 keeps its
/// challenge). `/v1`, the probes, `/metrics` and `/openapi.json` keep their
/// problems, and so does a client that does not ask for HTML.
pub(crate) async fn html_errors(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use axum::http::header;
    let path = request.uri().path();
    let machine =
        path.starts_with("/v1/") || matches!(path, "/v1" | "/healthz" | "/readyz" | "/metrics" | "/openapi.json");
    let wants_html = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    let response = next.run(request).await;
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if machine || !wants_html || !is_problem {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, super::MAX_BODY_BYTES)
        .await
        .unwrap_or_default();
    let problem: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let text = |key: &str| problem[key].as_str().unwrap_or("").to_string();
    let markup = pages::error(parts.status.as_u16(), &text("title"), &text("detail"));
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    Response::from_parts(parts, axum::body::Body::from(markup.into_string()))
}
