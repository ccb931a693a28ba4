//! The dashboard: server-rendered HTML (no JavaScript, no assets from the
//! internet), refreshed by the browser every few seconds. Every number comes
//! from an exact query on committed state.

use std::fmt::Write as _;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;

use super::{AppState, Problem};
use crate::period::Period;

/// Seconds between refreshes of live pages.
pub const REFRESH_SECS: u32 = 2;
/// Runs listed on the front page.
pub const RUNS_SHOWN: i64 = 20;
/// Items listed on the items page.
pub const ITEMS_SHOWN: i64 = 200;

/// Escapes text for HTML.
pub fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn page(title: &str, refresh: bool, body: &str) -> Response {
    let refresh = if refresh {
        format!("<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">")
    } else {
        String::new()
    };
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\">{refresh}<title>settled: {title}</title><style>
body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}} nav a{{margin-right:1em}}
table{{border-collapse:collapse;margin:1em 0}} td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left;font-size:.9em}}
th{{background:#f3f3f3}} .bar{{width:260px;height:14px;background:#eee;display:inline-block;vertical-align:middle}}
.bar span{{display:block;height:14px;background:#2a7}} .waiting{{background:#fdd}} .mono{{font-family:monospace}}
.ok{{color:#080}} .fail{{color:#b00}} td.mono{{max-width:22em;word-break:break-all}}
</style></head><body><nav><b>settled</b> <a href=\"/\">runs</a><a href=\"/workers\">workers</a>\
<a href=\"/items?status=failed\">failed</a><a href=\"/items?status=held\">held</a><a href=\"/locks\">locks</a>\
<a href=\"/metrics\">metrics</a></nav><h1>{title}</h1>{body}</body></html>",
        title = esc(title)
    );
    let mut response = (StatusCode::OK, html).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

fn db_error(err: impl std::fmt::Display) -> Response {
    Problem::unavailable(err).into_response()
}


/// Exact counts of a period: (total, done, settled, failed, held, paid).
async fn period_counts(pool: &sqlx::PgPool, period: &str) -> Result<(i64, i64, i64, i64, i64, String), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status IN ('settled', 'failed', 'held')),
                count(*) FILTER (WHERE status = 'settled'), count(*) FILTER (WHERE status = 'failed'),
                count(*) FILTER (WHERE status = 'held'),
                coalesce((SELECT sum(amount) FROM settlement.reward_ledger WHERE period = $1::date), 0)::text
         FROM settlement.token_trade_volume WHERE period = $1::date",
    )
    .bind(period)
    .fetch_one(pool)
    .await
}

/// Settled items per second of a period, oldest first (from ledger times).
async fn throughput(pool: &sqlx::PgPool, period: &str) -> Result<Vec<(f64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT extract(epoch FROM date_trunc('second', created_at))::float8, count(*)
         FROM settlement.reward_ledger WHERE period = $1::date GROUP BY 1 ORDER BY 1",
    )
    .bind(period)
    .fetch_all(pool)
    .await
}

/// An inline SVG bar chart of settled items per second.
fn chart(points: &[(f64, i64)]) -> String {
    if points.is_empty() {
        return "<p>no payments yet</p>".into();
    }
    let (w, h) = (600.0, 120.0);
    let first = points[0].0;
    let span = (points[points.len() - 1].0 - first).max(1.0) + 1.0;
    let max = points.iter().map(|p| p.1).max().unwrap_or(1).max(1) as f64;
    let bar_w = (w / span).max(1.0);
    let mut svg = format!(
        "<svg width=\"{w}\" height=\"{}\" role=\"img\" aria-label=\"settled per second\">",
        h + 16.0
    );
    for (t, n) in points {
        let x = (t - first) / span * w;
        let bh = *n as f64 / max * h;
        let _ = write!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar_w:.1}\" height=\"{bh:.1}\" fill=\"#2a7\"/>",
            h - bh
        );
    }
    let _ = write!(
        svg,
        "<text x=\"0\" y=\"{}\" font-size=\"11\">peak {max} settled/s over {span:.0} s</text></svg>",
        h + 14.0
    );
    svg
}

fn progress_bar(done: i64, total: i64) -> String {
    let pct = if total == 0 {
        100.0
    } else {
        done as f64 * 100.0 / total as f64
    };
    format!(
        "<span class=\"bar\" data-done=\"{done}\" data-total=\"{total}\"><span style=\"width:{pct:.1}%\"></span></span> {done}/{total} ({pct:.1}%)"
    )
}

/// `GET /`: runs with progress, amounts, throughput and ETA.
pub async fn runs(State(state): State<AppState>) -> Response {
    let pool = &state.pool;
    let runs = match crate::settlement::job().list_runs(pool, RUNS_SHOWN).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let mut body = String::from(
        "<table><tr><th>run</th><th>period</th><th>state</th><th>starter</th><th>started (UTC)</th><th>finished</th>\
         <th>progress</th><th>settled / failed / held</th><th>paid (base units)</th><th>ETA</th></tr>",
    );
    let mut live_chart = String::new();
    for run in &runs {
        let (id, period, run_state, starter, started, finished) = (
            run.id,
            &run.scope,
            run.state.as_str(),
            run.started_by,
            run.started_at,
            run.finished_at,
        );
        let (total, done, settled, failed, held, paid) = match period_counts(pool, period).await {
            Ok(c) => c,
            Err(e) => return db_error(e),
        };
        let eta = if run_state == "running" {
            let points = throughput(pool, period).await.unwrap_or_default();
            let recent: Vec<&(f64, i64)> = points.iter().rev().take(10).collect();
            let rate = recent.iter().map(|p| p.1).sum::<i64>() as f64 / recent.len().max(1) as f64;
            if live_chart.is_empty() {
                live_chart = format!("<h2>run {id}: settled per second</h2>{}", chart(&points));
            }
            if rate > 0.0 {
                format!("{:.0} s", (total - done) as f64 / rate)
            } else {
                "-".into()
            }
        } else {
            "-".into()
        };
        let starter = starter
            .map(|u| u.simple().to_string()[..8].to_string())
            .unwrap_or_else(|| "operator".into());
        let _ = write!(
            body,
            "<tr><td><a href=\"/runs/{id}\">{id}</a></td><td>{}</td><td>{}</td><td class=\"mono\">{starter}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{settled} / {failed} / {held}</td><td class=\"mono\">{}</td><td>{eta}</td></tr>",
            esc(period),
            esc(run_state),
            started.format("%Y-%m-%d %H:%M:%S"),
            finished.map(|f| f.format("%H:%M:%S").to_string()).unwrap_or_else(|| "-".into()),
            progress_bar(done, total),
            esc(&paid),
        );
    }
    body.push_str("</table>");
    if runs.is_empty() {
        body.push_str("<p>No runs yet.</p>");
    }
    body.push_str(&live_chart);
    page("runs", true, &body)
}

/// `GET /runs/{id}`: a run's report, its chart and its verification.
pub async fn run_report(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return Problem::bad_request("invalid-id", "run id must be an integer").into_response();
    };
    let pool = &state.pool;
    let run = match crate::settlement::job().get_run(pool, id).await {
        Ok(r) => r.map(|r| (r.scope, r.state.as_str().to_string(), r.report)),
        Err(e) => return db_error(e),
    };
    let Some((period, run_state, report)) = run else {
        return Problem::not_found("unknown-run", format!("no run {id}")).into_response();
    };
    let mut body = format!("<p>period {} · state {}</p>", esc(&period), esc(&run_state));
    if let Ok(p) = Period::parse(&period) {
        match pool.acquire().await {
            Ok(mut conn) => match crate::verify::verify(&mut conn, p).await {
                Ok(v) => {
                    let _ = write!(
                        body,
                        "<h2>verification: <span class=\"{}\">{}</span></h2><table><tr><th>check</th><th>result</th><th>offenders</th></tr>",
                        if v.ok { "ok" } else { "fail" },
                        if v.ok { "every check holds" } else { "FAILED" }
                    );
                    for c in &v.checks {
                        let _ = write!(
                            body,
                            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
                            esc(c.description),
                            if c.ok { "ok" } else { "fail" },
                            if c.ok { "ok" } else { "FAIL" },
                            esc(&c.offenders.join("; "))
                        );
                    }
                    let _ = write!(
                        body,
                        "</table><p>ledger total {} · expected {}</p>",
                        esc(&v.ledger_total),
                        esc(&v.expected_total)
                    );
                }
                Err(e) => {
                    let _ = write!(
                        body,
                        "<p class=\"fail\">verification could not run: {}</p>",
                        esc(&e.to_string())
                    );
                }
            },
            Err(e) => return db_error(e),
        }
    }
    body.push_str(&chart(&throughput(pool, &period).await.unwrap_or_default()));
    if let Some(report) = report {
        let _ = write!(
            body,
            "<h2>stored report</h2><pre>{}</pre>",
            esc(&serde_json::to_string_pretty(&report).unwrap_or_default())
        );
    }
    page(&format!("run {id}"), run_state == "running", &body)
}

/// `GET /workers`.
pub async fn workers(State(state): State<AppState>) -> Response {
    let all = match settled_engine::workers::list(&state.pool, Some(&crate::settlement::queue()), 100).await {
        Ok(w) => w,
        Err(e) => return Problem::unavailable(e).into_response(),
    };
    let mut body = String::from(
        "<table><tr><th>worker</th><th>host</th><th>pid</th><th>version</th><th>state</th><th>last heartbeat</th>\
         <th>items held</th><th>settled</th><th>failed</th><th>fence rejections</th></tr>",
    );
    for w in &all {
        let _ = write!(
            body,
            "<tr><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} s ago</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            &w.id.simple().to_string()[..8],
            esc(&w.host),
            w.pid,
            esc(&w.version),
            esc(&w.state),
            w.heartbeat_age_secs,
            w.leases_held,
            w.items_settled,
            w.items_failed,
            w.fence_rejections
        );
    }
    body.push_str("</table>");
    page("workers", true, &body)
}

/// Query of the items page.
#[derive(Debug, Deserialize)]
pub struct ItemsQuery {
    status: Option<String>,
}

/// `GET /items?status=failed|held`: with their errors and a retry action.
pub async fn items(State(state): State<AppState>, Query(q): Query<ItemsQuery>) -> Response {
    let status = match q.status.as_deref() {
        Some("held") => "held",
        _ => "failed",
    };
    let rows: Vec<(chrono::NaiveDate, String, i32, Option<String>)> = match sqlx::query_as(
        "SELECT period, creator, attempt, last_error FROM settlement.token_trade_volume
         WHERE status = $1 ORDER BY period DESC, creator LIMIT $2",
    )
    .bind(status)
    .bind(ITEMS_SHOWN)
    .fetch_all(&state.pool)
    .await
    {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let mut body =
        String::from("<table><tr><th>period</th><th>creator</th><th>attempt</th><th>last error</th><th></th></tr>");
    for (period, creator, attempt, error) in &rows {
        let action = if status == "failed" {
            format!(
                "<form method=\"post\" action=\"/dashboard/retry\"><input type=\"hidden\" name=\"period\" value=\"{period}\">\
                 <input type=\"hidden\" name=\"creator\" value=\"{}\"><input type=\"password\" name=\"token\" placeholder=\"API token\" size=\"10\">\
                 <button>retry</button></form>",
                esc(creator)
            )
        } else {
            "release the hold via POST /v1/holds/{id}/release".into()
        };
        let _ = write!(
            body,
            "<tr><td>{period}</td><td class=\"mono\">{}</td><td>{attempt}</td><td>{}</td><td>{action}</td></tr>",
            esc(creator),
            esc(error.as_deref().unwrap_or("")),
        );
    }
    body.push_str("</table>");
    if rows.is_empty() {
        let _ = write!(body, "<p>No {status} items.</p>");
    }
    page(&format!("{status} items"), false, &body)
}

/// The retry form.
#[derive(Debug, Deserialize)]
pub struct RetryForm {
    period: String,
    creator: String,
    token: String,
}

/// `POST /dashboard/retry`: puts a failed item back (API token required).
pub async fn retry(State(state): State<AppState>, Form(form): Form<RetryForm>) -> Response {
    let mut headers = axum::http::HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", form.token)) {
        headers.insert(header::AUTHORIZATION, v);
    }
    if let Err(p) = super::authorize(&state, &headers) {
        return p.into_response();
    }
    let Ok(period) = Period::parse(&form.period) else {
        return Problem::invalid("period", "not a date").into_response();
    };
    let Ok(creator) = crate::address::CreatorAddress::parse(&form.creator) else {
        return Problem::invalid("creator", "not an address").into_response();
    };
    match crate::settlement::retry_failed(&state.pool, period, Some(&creator)).await {
        Ok(_) => Redirect::to("/items?status=failed").into_response(),
        Err(e) => Problem::unavailable(e).into_response(),
    }
}

type LockRow = (
    i32,
    Option<String>,
    String,
    String,
    bool,
    Option<String>,
    Vec<i32>,
    Option<f64>,
    Option<String>,
    Option<String>,
);

/// `GET /locks`: who holds which lock on the settlement and engine tables,
/// and who waits for whom (`pg_locks` joined with `pg_stat_activity`).
pub async fn locks(State(state): State<AppState>) -> Response {
    let rows: Vec<LockRow> = match sqlx::query_as(
        "SELECT l.pid, a.application_name, l.locktype, l.mode, l.granted,
                coalesce(c.relname, CASE WHEN l.locktype = 'transactionid' THEN 'xid ' || l.transactionid::text END),
                pg_blocking_pids(l.pid),
                extract(epoch FROM now() - a.xact_start)::float8,
                a.state, left(a.query, 200)
         FROM pg_locks l
         JOIN pg_stat_activity a ON a.pid = l.pid
         LEFT JOIN pg_class c ON c.oid = l.relation
         LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE a.datname = current_database() AND l.pid <> pg_backend_pid()
           AND (n.nspname IN ('settlement', 'settled_engine') OR NOT l.granted OR l.locktype IN ('tuple', 'transactionid'))
           AND (c.relkind IS NULL OR c.relkind = 'r')
         ORDER BY l.granted, l.pid, l.locktype",
    )
    .fetch_all(&state.pool)
    .await
    {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let waiting = rows.iter().filter(|r| !r.4).count();
    let mut body = format!(
        "<p>{} lock(s), <b id=\"waiting\" data-waiting=\"{waiting}\">{waiting} waiting</b>. \
         Row locks taken by SELECT ... FOR UPDATE are not listed one by one by PostgreSQL; a backend blocked on one \
         shows as waiting on a transaction id or tuple.</p>\
         <table><tr><th>pid</th><th>application</th><th>lock</th><th>mode</th><th>granted</th><th>on</th>\
         <th>waits for</th><th>xact age</th><th>state</th><th>query</th></tr>",
        rows.len()
    );
    for (pid, app, locktype, mode, granted, on, blockers, age, act, query) in &rows {
        let _ = write!(
            body,
            "<tr class=\"{}\"><td>{pid}</td><td>{}</td><td>{}</td><td>{}</td><td>{granted}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td></tr>",
            if *granted { "" } else { "waiting" },
            esc(app.as_deref().unwrap_or("")),
            esc(locktype),
            esc(mode),
            esc(on.as_deref().unwrap_or("")),
            blockers.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", "),
            age.map(|a| format!("{a:.1} s")).unwrap_or_default(),
            esc(act.as_deref().unwrap_or("")),
            esc(query.as_deref().unwrap_or("")),
        );
    }
    body.push_str("</table>");
    page("locks", true, &body)
}
