//! `/audit`: the audit log, newest first, filtered by actor and time, paged
//! by keyset (`after=` the last id shown, `limit=`; never OFFSET). Reads
//! only; the rows are written by `crate::audit`.

use axum::extract::{Query, State};
use maud::{html, Markup};
use serde::Deserialize;

use super::pages::page;
use super::Page;
use crate::api::{AppState, Problem};
use crate::audit::{self, Filter, Row};

/// Rows on a page unless `limit=` says otherwise.
pub(crate) const AUDIT_ROWS_DEFAULT: i64 = 100;
/// Most rows on a page.
pub(crate) const AUDIT_ROWS_MAX: i64 = 500;

/// The query of `/audit`: every field optional; an empty one is no filter.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct AuditQuery {
    actor: Option<String>,
    since: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

fn positive(field: &'static str, text: &str, max: i64) -> Result<i64, Problem> {
    text.parse::<i64>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| Problem::invalid(field, format!("{field} must be an integer in 1..={max}, not {text:?}")))
}

impl AuditQuery {
    fn filter(&self) -> Result<Filter, Problem> {
        Ok(Filter {
            actor: given(&self.actor).map(str::to_string),
            since: given(&self.since)
                .map(|t| audit::parse_since(t).map_err(|why| Problem::invalid("since", why)))
                .transpose()?,
            before_id: given(&self.after).map(|t| positive("after", t, i64::MAX)).transpose()?,
            limit: given(&self.limit)
                .map(|t| positive("limit", t, AUDIT_ROWS_MAX))
                .transpose()?
                .unwrap_or(AUDIT_ROWS_DEFAULT),
        })
    }

    /// The link to the page after the one that ends with row `last`.
    fn next(&self, last: i64) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [("actor", &self.actor), ("since", &self.since), ("limit", &self.limit)] {
            if let Some(value) = given(value) {
                query.append_pair(key, value);
            }
        }
        query.append_pair("after", &last.to_string());
        format!("/audit?{}", query.finish())
    }
}

/// `GET /audit`.
pub(crate) async fn audit(State(state): State<AppState>, Query(query): Query<AuditQuery>) -> Page {
    let filter = query.filter()?;
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let rows = audit::list(&mut conn, &filter).await.map_err(Problem::unavailable)?;
    let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) == filter.limit;
    let next = rows.last().filter(|_| full).map(|last| query.next(last.id));
    Ok(audit_page(&query, &rows, next.as_deref()))
}

fn audit_page(query: &AuditQuery, rows: &[Row], next: Option<&str>) -> Markup {
    let body = html! {
        form #find-audit method="get" action="/audit" {
            label { "actor " input type="text" name="actor" size="24" value=(given(&query.actor).unwrap_or("")); } " "
            label { "since " input type="text" name="since" size="22" placeholder="YYYY-MM-DD or RFC 3339"
                value=(given(&query.since).unwrap_or("")); } " "
            button type="submit" { "find" }
        }
        @if rows.is_empty() {
            p { "No rows match." }
        } @else {
            table #audit {
                tr { th { "#" } th { "at (UTC)" } th { "actor" } th { "action" } th { "target" } th { "outcome" } th { "count" } }
                @for r in rows {
                    tr data-audit=(r.id) {
                        td { (r.id) }
                        td { (r.at.format("%Y-%m-%d %H:%M:%S")) }
                        td.mono { (r.actor) }
                        td.mono { (r.action) }
                        td.mono { (r.target) }
                        td { (r.outcome) }
                        td { (r.count) }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a rel="next" href=(next) { "older rows →" } }
        }
        p.note {
            "Every request that acts, every refusal (401 and 403: one row per actor, action and minute, \
             with a count) and every operator command of the CLI. A row that acted was written in the \
             transaction of its effect. Paged by keyset (never OFFSET)."
        }
    };
    page("audit log", None, body)
}
