//! What a creator's balance is, and what moved it.
//!
//! Three figures, read in one statement so they agree with each other:
//!
//! - **posted**: every credit (the ledger of every period, archived ones
//!   carried) less the payouts paid for good;
//! - **pending**: the payouts still in flight (`created`, `queued`, `sent`):
//!   debited, not yet paid, and coming back if they fail;
//! - **available**: what a new payout may take: the balance row
//!   (`settlement.creator_balance`, which is posted less pending), or 0
//!   while the creator has an active hold.
//!
//! The statement lists every line that moved the balance row, oldest
//! first: the carried total of archived periods, each period's credit,
//! each payout (its amount out when it was made), each return (the amount
//! back when a payout failed, was returned, cancelled or expired), and
//! holds placed and released (no amount). Each line carries the running
//! balance after it, computed by the database in exact NUMERIC; the last
//! line's running balance is the balance row, and so posted less pending.

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use utoipa::ToSchema;

use crate::address::CreatorAddress;

/// Statement lines per page by default.
pub(crate) const STATEMENT_PAGE: u32 = 100;
/// Most statement lines per page.
pub(crate) const MAX_STATEMENT_PAGE: u32 = 1000;

/// A creator's balances, in base units (decimal strings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct Balances {
    /// Credits (every period's ledger, archived ones carried) less the
    /// payouts paid for good.
    pub posted: String,
    /// Payouts in flight (`created`, `queued`, `sent`): debited, not yet
    /// paid, and back on the balance if they fail or are returned.
    pub pending: String,
    /// What a new payout may take: posted less pending, or 0 while a hold
    /// is active.
    pub available: String,
    /// True while the creator has an active hold.
    pub on_hold: bool,
}

impl Default for Balances {
    /// A creator with no balance row: nothing credited yet.
    fn default() -> Balances {
        Balances {
            posted: "0".into(),
            pending: "0".into(),
            available: "0".into(),
            on_hold: false,
        }
    }
}

/// Every credit of `creator`: the carried total of archived periods, and
/// one ledger row per live period (looked up by its key, one index probe
/// per period: the ledger is partitioned by period). $1 = creator.
const CREDITS: &str = "SELECT c.amount FROM settlement.ledger_carry c WHERE c.creator = $1
     UNION ALL
     SELECT l.amount FROM settlement.settlement_policy p
     JOIN LATERAL (SELECT amount FROM settlement.reward_ledger l
                   WHERE l.period = p.period AND l.creator = $1) l ON true";

/// The balance row of `creator` and its balances, or `None` when it has no
/// balance row.
pub(crate) async fn balances(
    conn: &mut PgConnection,
    creator: &CreatorAddress,
) -> sqlx::Result<Option<(String, Balances)>> {
    let row: Option<(String, String, String, bool)> = sqlx::query_as(&format!(
        "SELECT ((SELECT coalesce(sum(amount), 0) FROM ({CREDITS}) credits)
                 - (SELECT coalesce(sum(amount), 0) FROM settlement.payouts
                    WHERE creator = $1 AND status = 'paid'))::text,
                (SELECT coalesce(sum(amount), 0) FROM settlement.payouts
                 WHERE creator = $1 AND status IN ('created', 'queued', 'sent'))::text,
                b.balance::text,
                EXISTS (SELECT 1 FROM settlement.creator_holds h
                        WHERE h.creator = $1 AND h.released_at IS NULL)
         FROM settlement.creator_balance b WHERE b.creator = $1"
    ))
    .bind(creator.as_str()) // $1
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(posted, pending, balance, on_hold)| {
        let available = if on_hold { "0".into() } else { balance.clone() };
        (
            balance,
            Balances {
                posted,
                pending,
                available,
                on_hold,
            },
        )
    }))
}

/// What a statement line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LineKind {
    /// The ledger total of the creator's archived periods (first line).
    Carried,
    /// A period's reward.
    Credit,
    /// A payout made: its amount leaves the balance.
    Payout,
    /// A payout that ended unpaid or was taken back: its amount returns.
    Return,
    /// A hold placed: new payouts are refused until it is released.
    HoldPlaced,
    /// A hold released.
    HoldReleased,
}

impl LineKind {
    /// Its name, as the API writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LineKind::Carried => "carried",
            LineKind::Credit => "credit",
            LineKind::Payout => "payout",
            LineKind::Return => "return",
            LineKind::HoldPlaced => "hold_placed",
            LineKind::HoldReleased => "hold_released",
        }
    }

    /// Its order among lines of the same instant, as stored in the cursor.
    fn rank(self) -> i32 {
        match self {
            LineKind::Carried => 0,
            LineKind::Credit => 1,
            LineKind::Payout => 2,
            LineKind::Return => 3,
            LineKind::HoldPlaced => 4,
            LineKind::HoldReleased => 5,
        }
    }

    fn from_rank(rank: i32) -> Option<LineKind> {
        [
            LineKind::Carried,
            LineKind::Credit,
            LineKind::Payout,
            LineKind::Return,
            LineKind::HoldPlaced,
            LineKind::HoldReleased,
        ]
        .into_iter()
        .find(|k| k.rank() == rank)
    }
}

/// One line of a statement.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct StatementLine {
    /// What it records.
    pub kind: LineKind,
    /// When (null for the carried total of archived periods).
    #[schema(required = true)]
    pub at: Option<DateTime<Utc>>,
    /// Its effect on the balance in base units, signed (`-250` for a payout).
    pub amount: String,
    /// The balance after it.
    pub balance: String,
    /// The period a credit settles.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub period: Option<NaiveDate>,
    /// The payout of a payout or return line.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub payout_id: Option<i64>,
    /// The payout's state now (payout lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub payout_status: Option<String>,
    /// The hold of a hold line.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub hold_id: Option<i64>,
    /// Why: a hold's reason, or the state a returned payout ended in.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub note: Option<String>,
}

/// Where a statement page starts: after the line with this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// None: the carried line, before every instant.
    at: Option<DateTime<Utc>>,
    kind: LineKind,
    id: i64,
}

/// The carried line's instant in the order: before every other line.
const CARRIED_AT: &str = "-infinity";
/// How a cursor names the carried line's instant.
const CARRIED_CURSOR: &str = "start";

impl Cursor {
    /// The cursor's text, as `next` carries it: `<microseconds>.<kind>.<id>`.
    pub(crate) fn encode(self) -> String {
        let at = self
            .at
            .map_or_else(|| CARRIED_CURSOR.to_string(), |at| at.timestamp_micros().to_string());
        format!("{at}.{}.{}", self.kind.rank(), self.id)
    }

    /// Reads a cursor written by [`Cursor::encode`].
    pub(crate) fn decode(text: &str) -> Option<Cursor> {
        let mut parts = text.split('.');
        let at = match parts.next()? {
            CARRIED_CURSOR => None,
            micros => Some(DateTime::from_timestamp_micros(micros.parse().ok()?)?),
        };
        let kind = LineKind::from_rank(parts.next()?.parse().ok()?)?;
        let id: i64 = parts.next()?.parse().ok()?;
        if parts.next().is_some() || (at.is_none() != (kind == LineKind::Carried)) {
            return None;
        }
        Some(Cursor { at, kind, id })
    }
}

/// A page of a statement.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Statement {
    /// The creator.
    pub creator: String,
    /// The balance before the page's first line.
    pub opening_balance: String,
    /// The lines, oldest first.
    pub lines: Vec<StatementLine>,
    /// The balance after the page's last line.
    pub closing_balance: String,
    /// The cursor of the next page (`after=`), null on the last.
    #[schema(required = true)]
    pub next: Option<String>,
}

/// Which lines: those at or after `from` and before `to`, after `after`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    /// First instant (inclusive).
    pub from: Option<DateTime<Utc>>,
    /// Last instant (exclusive).
    pub to: Option<DateTime<Utc>>,
    /// The previous page's `next`.
    pub after: Option<Cursor>,
}

/// Every line of `creator`, with its order key (at, rank, id). $1 = creator.
fn lines_sql() -> String {
    format!(
        "SELECT '{CARRIED_AT}'::timestamptz AS at, 0 AS rank, 0::bigint AS id, c.amount AS amount,
                NULL::date AS period, NULL::bigint AS payout_id, NULL::text AS payout_status,
                NULL::bigint AS hold_id, NULL::text AS note
         FROM settlement.ledger_carry c WHERE c.creator = $1
         UNION ALL
         SELECT l.created_at, 1, (l.period - date '1970-01-01')::bigint, l.amount,
                l.period, NULL, NULL, NULL, NULL
         FROM settlement.settlement_policy p
         JOIN LATERAL (SELECT * FROM settlement.reward_ledger l
                       WHERE l.period = p.period AND l.creator = $1) l ON true
         UNION ALL
         SELECT o.created_at, 2, o.id, -o.amount, NULL, o.id, o.status, NULL, NULL
         FROM settlement.payouts o WHERE o.creator = $1
         UNION ALL
         SELECT r.returned_at, 3, r.payout_id, r.amount, NULL, r.payout_id, NULL, NULL, o.status
         FROM settlement.payout_returns r JOIN settlement.payouts o ON o.id = r.payout_id
         WHERE r.creator = $1
         UNION ALL
         SELECT h.created_at, 4, h.id, 0, NULL, NULL, NULL, h.id, h.reason
         FROM settlement.creator_holds h WHERE h.creator = $1
         UNION ALL
         SELECT h.released_at, 5, h.id, 0, NULL, NULL, NULL, h.id, h.reason
         FROM settlement.creator_holds h WHERE h.creator = $1 AND h.released_at IS NOT NULL"
    )
}

#[derive(sqlx::FromRow)]
struct LineRow {
    opening: String,
    at: Option<DateTime<Utc>>,
    rank: Option<i32>,
    id: Option<i64>,
    amount: Option<String>,
    balance: Option<String>,
    period: Option<NaiveDate>,
    payout_id: Option<i64>,
    payout_status: Option<String>,
    hold_id: Option<i64>,
    note: Option<String>,
}

/// A page of `creator`'s statement: up to `limit` lines of `window`, oldest
/// first, each with the running balance after it. The opening balance is
/// the sum of every line before the page, so a line's balance is the same
/// whichever page shows it. One statement: one snapshot.
pub(crate) async fn statement(
    conn: &mut PgConnection,
    creator: &CreatorAddress,
    window: Window,
    limit: u32,
) -> sqlx::Result<Statement> {
    let lines = lines_sql();
    // The page starts after the cursor, or at `from`, or at the beginning.
    let (start_at, start_rank, start_id, inclusive) = match window.after {
        Some(c) => (c.at, c.kind.rank(), c.id, false),
        None => (window.from, -1, -1, true),
    };
    // $2..$4 the start key (a NULL instant: before every instant), $5
    // whether the key itself is in the page, $6 `from`, $7 `to`, $8 limit + 1.
    // The opening LEFT JOIN the page: an empty page still answers its opening.
    let sql = format!(
        "WITH lines AS ({lines}),
         keyed AS (SELECT *, ((at, rank, id) > (coalesce($2, '{CARRIED_AT}'::timestamptz), $3, $4)
                              OR ($5 AND (at, rank, id) = (coalesce($2, '{CARRIED_AT}'::timestamptz), $3, $4)))
                             AS in_page
                   FROM lines),
         opening AS (SELECT coalesce(sum(amount), 0) AS total FROM keyed WHERE NOT in_page),
         page AS (SELECT * FROM keyed
                  WHERE in_page AND ($6::timestamptz IS NULL OR at >= $6) AND ($7::timestamptz IS NULL OR at < $7)
                  ORDER BY at, rank, id LIMIT $8)
         SELECT o.total::text AS opening,
                CASE WHEN p.rank = 0 THEN NULL ELSE p.at END AS at, p.rank, p.id,
                CASE WHEN p.amount > 0 THEN '+' || p.amount::text ELSE p.amount::text END AS amount,
                (o.total + sum(p.amount) OVER (ORDER BY p.at, p.rank, p.id ROWS UNBOUNDED PRECEDING))::text
                    AS balance,
                p.period, p.payout_id, p.payout_status, p.hold_id, p.note
         FROM opening o LEFT JOIN page p ON true
         ORDER BY p.at, p.rank, p.id"
    );
    let rows: Vec<LineRow> = sqlx::query_as(&sql)
        .bind(creator.as_str()) // $1
        .bind(start_at) // $2
        .bind(start_rank) // $3
        .bind(start_id) // $4
        .bind(inclusive) // $5
        .bind(window.from) // $6
        .bind(window.to) // $7
        .bind(i64::from(limit) + 1) // $8
        .fetch_all(&mut *conn)
        .await?;
    let opening = rows.first().map_or_else(|| "0".to_string(), |r| r.opening.clone());
    let mut lines: Vec<(Cursor, StatementLine)> = rows
        .into_iter()
        .filter_map(|r| {
            let kind = LineKind::from_rank(r.rank?)?;
            let cursor = Cursor {
                at: r.at,
                kind,
                id: r.id?,
            };
            Some((
                cursor,
                StatementLine {
                    kind,
                    at: r.at,
                    amount: r.amount?,
                    balance: r.balance?,
                    period: r.period,
                    payout_id: r.payout_id,
                    payout_status: r.payout_status,
                    hold_id: r.hold_id,
                    note: r.note,
                },
            ))
        })
        .collect();
    let more = lines.len() > limit as usize;
    lines.truncate(limit as usize);
    let next = if more {
        lines.last().map(|(c, _)| c.encode())
    } else {
        None
    };
    let closing = lines.last().map_or_else(|| opening.clone(), |(_, l)| l.balance.clone());
    Ok(Statement {
        creator: creator.as_str().to_string(),
        opening_balance: opening,
        lines: lines.into_iter().map(|(_, l)| l).collect(),
        closing_balance: closing,
        next,
    })
}
