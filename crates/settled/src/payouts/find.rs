//! Finding payouts, for operators: a filtered list, newest first, paged by
//! keyset (`id < after`, never OFFSET: a page costs the same deep in the
//! list as at its head), and one payout with everything that happened to
//! it: its history with what moved it, the provider's events for it, its
//! return, its conflicts, its delivery job. Reads only.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::PayoutState;
use crate::address::CreatorAddress;

/// Payouts listed on one page at most.
pub(crate) const PAGE_ROWS_MAX: i64 = 500;
/// Payouts listed on one page unless asked otherwise.
pub(crate) const PAGE_ROWS_DEFAULT: i64 = 50;

/// Which payouts to list.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    /// In this state.
    pub status: Option<PayoutState>,
    /// To this creator.
    pub creator: Option<CreatorAddress>,
    /// This one.
    pub id: Option<i64>,
    /// Made at or after.
    pub from: Option<DateTime<Utc>>,
    /// Made before.
    pub to: Option<DateTime<Utc>>,
    /// Older than this payout (the previous page's last).
    pub after: Option<i64>,
}

/// A payout in a list.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Line {
    /// Its id.
    pub id: i64,
    /// `withdrawal` or `settlement`.
    pub kind: String,
    /// Who is paid.
    pub creator: String,
    /// Base units.
    pub amount: String,
    /// Where it stands.
    pub status: PayoutState,
    /// The provider's id, once it accepted it.
    pub provider_id: Option<String>,
    /// Why its last move happened.
    pub reason: Option<String>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Its last change of state.
    pub updated_at: DateTime<Utc>,
}

/// One page of a list: its payouts and the cursor of the next page (None:
/// the last page).
#[derive(Debug, Clone)]
pub(crate) struct Page {
    /// Newest first.
    pub lines: Vec<Line>,
    /// `after` for the next page.
    pub next: Option<i64>,
}

const LINE_COLUMNS: &str =
    "id, kind, creator, amount::text AS amount, status, provider_id, reason, created_at, updated_at";

/// Up to `limit` (1..=[`PAGE_ROWS_MAX`]) payouts matching `filter`, newest
/// first (by id: ids are handed out in order of making).
pub(crate) async fn list(conn: &mut PgConnection, filter: &Filter, limit: i64) -> sqlx::Result<Page> {
    let limit = limit.clamp(1, PAGE_ROWS_MAX);
    let mut lines: Vec<Line> = sqlx::query_as(&format!(
        "SELECT {LINE_COLUMNS} FROM settlement.payouts
         WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR creator = $2)
           AND ($3::bigint IS NULL OR id = $3) AND ($4::timestamptz IS NULL OR created_at >= $4)
           AND ($5::timestamptz IS NULL OR created_at < $5) AND ($6::bigint IS NULL OR id < $6)
         ORDER BY id DESC LIMIT $7"
    ))
    .bind(filter.status.map(PayoutState::as_str)) // $1
    .bind(filter.creator.as_ref().map(CreatorAddress::as_str)) // $2
    .bind(filter.id) // $3
    .bind(filter.from) // $4
    .bind(filter.to) // $5
    .bind(filter.after) // $6
    .bind(limit + 1) // $7
    .fetch_all(conn)
    .await?;
    let next = if lines.len() as i64 > limit {
        lines.truncate(limit as usize);
        lines.last().map(|l| l.id)
    } else {
        None
    };
    Ok(Page { lines, next })
}

/// A move of a payout's state.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Move {
    /// The state it left (None: its making).
    pub from_state: Option<String>,
    /// The state it entered.
    pub to_state: String,
    /// Why.
    pub reason: Option<String>,
    /// What moved it (the API, a deliverer, a webhook, a look-up,
    /// reconcile, the expiry, a settlement run); None before migration
    /// `20261206002001`.
    pub moved_by: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// A provider event received for a payout.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Event {
    /// The event's id.
    pub id: String,
    /// Its type (`payment.paid`...).
    pub kind: String,
    /// What applying it did.
    pub outcome: String,
    /// More on that.
    pub detail: Option<String>,
    /// When it arrived.
    pub received_at: DateTime<Utc>,
}

/// What the provider said that contradicts the payout.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Contradiction {
    /// What the provider said.
    pub provider_status: String,
    /// Where it said it.
    pub source: String,
    /// More.
    pub detail: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// A payout's delivery job: its attempts and errors, and who holds it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Delivery {
    /// The job's status.
    pub status: String,
    /// Attempts so far (the fence).
    pub attempt: i32,
    /// The worker holding its lease.
    pub lease_owner: Option<uuid::Uuid>,
    /// Why its last attempt failed.
    pub last_error: Option<String>,
    /// Its attempt history, as the engine keeps it.
    pub errors: serde_json::Value,
}

/// Everything about one payout.
#[derive(Debug, Clone)]
pub(crate) struct Detail {
    /// The payout.
    pub line: Line,
    /// The key every call to the provider carries.
    pub provider_key: Option<String>,
    /// Its history, oldest first.
    pub history: Vec<Move>,
    /// The provider's events about it, oldest first.
    pub events: Vec<Event>,
    /// Its amount back on the balance, once, and when.
    pub returned: Option<(String, DateTime<Utc>)>,
    /// What the provider said against it.
    pub conflicts: Vec<Contradiction>,
    /// Its delivery job (None: a settlement's payout, which has none).
    pub delivery: Option<Delivery>,
}

/// Payout `id` with its history, events, return, conflicts and delivery
/// job; None when there is no such payout.
pub(crate) async fn detail(conn: &mut PgConnection, id: i64) -> sqlx::Result<Option<Detail>> {
    let line: Option<Line> = sqlx::query_as(&format!("SELECT {LINE_COLUMNS} FROM settlement.payouts WHERE id = $1"))
        .bind(id) // $1
        .fetch_optional(&mut *conn)
        .await?;
    let Some(line) = line else {
        return Ok(None);
    };
    let provider_key = sqlx::query_scalar("SELECT provider_key FROM settlement.payouts WHERE id = $1")
        .bind(id) // $1
        .fetch_one(&mut *conn)
        .await?;
    let history = sqlx::query_as(
        "SELECT from_state, to_state, reason, moved_by, at FROM settlement.payout_history
         WHERE payout_id = $1 ORDER BY id",
    )
    .bind(id) // $1
    .fetch_all(&mut *conn)
    .await?;
    let events = sqlx::query_as(
        "SELECT id, type AS kind, outcome, detail, received_at FROM settlement.provider_events
         WHERE payout_id = $1 ORDER BY received_at, id",
    )
    .bind(id) // $1
    .fetch_all(&mut *conn)
    .await?;
    let returned =
        sqlx::query_as("SELECT amount::text, returned_at FROM settlement.payout_returns WHERE payout_id = $1")
            .bind(id) // $1
            .fetch_optional(&mut *conn)
            .await?;
    let conflicts = sqlx::query_as(
        "SELECT provider_status, source, detail, at FROM settlement.payout_conflicts WHERE payout_id = $1 ORDER BY id",
    )
    .bind(id) // $1
    .fetch_all(&mut *conn)
    .await?;
    let delivery = sqlx::query_as(
        "SELECT status, attempt, lease_owner, last_error, errors FROM settlement.payout_jobs WHERE payout_id = $1",
    )
    .bind(id) // $1
    .fetch_optional(&mut *conn)
    .await?;
    Ok(Some(Detail {
        line,
        provider_key,
        history,
        events,
        returned,
        conflicts,
        delivery,
    }))
}

/// What the API lets a client do to a payout in `state`: (method and path,
/// what it does). Empty: nothing, the provider's word moves it from here.
pub(crate) fn actions(state: PayoutState) -> &'static [(&'static str, &'static str)] {
    match state {
        PayoutState::Created => &[
            (
                "POST /v1/payouts/{id}/confirm",
                "confirm it with its one-time token (only its maker has it)",
            ),
            ("POST /v1/payouts/{id}/cancel", "cancel it: its funds come back"),
        ],
        _ => &[],
    }
}
