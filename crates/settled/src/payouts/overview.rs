//! What operators watch of payouts, read exactly from committed state: the
//! payouts in each state with their amounts and the oldest one's age, what
//! was returned, the conflicts the provider raised, its events for payouts
//! settled does not know, and the provider keys waiting for an operator
//! (past the provider's key window, the provider could not say whether it
//! holds their payment). The dashboard's `/payouts` page and
//! `/metrics` both read it here; neither writes anything.

use sqlx::PgConnection;

use super::PayoutState;

/// The payouts in one state.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct StateTotals {
    /// The state.
    pub state: PayoutState,
    /// How many payouts are in it.
    pub count: i64,
    /// Their amounts added up, in base units (a decimal string).
    pub amount: String,
    /// Seconds since the longest-waiting one entered it (None when empty).
    pub oldest_secs: Option<f64>,
}

/// Payouts by state, and what came back.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Overview {
    /// Every state, in [`PayoutState::ALL`]'s order (empty ones too).
    pub states: Vec<StateTotals>,
    /// Payouts whose funds were returned.
    pub returned_count: i64,
    /// The base units returned to balances (a decimal string).
    pub returned_amount: String,
    /// Conflicts the provider raised (`settlement.payout_conflicts`).
    pub conflicts: i64,
    /// Provider events for payouts settled does not know.
    pub unknown_events: i64,
    /// Provider keys waiting for an operator: nothing is sent under them.
    pub keys_awaiting_operator: i64,
}

impl Overview {
    /// The totals of `state`.
    pub(crate) fn state(&self, state: PayoutState) -> &StateTotals {
        self.states
            .iter()
            .find(|s| s.state == state)
            .expect("an overview holds every state")
    }

    /// Every payout.
    pub(crate) fn total(&self) -> i64 {
        self.states.iter().map(|s| s.count).sum()
    }
}

#[derive(sqlx::FromRow)]
struct StateRow {
    status: PayoutState,
    count: i64,
    amount: String,
    oldest_secs: Option<f64>,
}

/// Reads the [`Overview`]: one pass over the payouts (a state's age is
/// from `updated_at`, which changes only with the state), and counts of
/// the returns, conflicts and unknown events.
pub(crate) async fn overview(conn: &mut PgConnection) -> anyhow::Result<Overview> {
    let rows: Vec<StateRow> = sqlx::query_as(
        "SELECT status, count(*) AS count, sum(amount)::text AS amount,
                extract(epoch FROM now() - min(updated_at))::float8 AS oldest_secs
         FROM settlement.payouts GROUP BY status",
    )
    .fetch_all(&mut *conn)
    .await?;
    let states = PayoutState::ALL
        .into_iter()
        .map(|state| match rows.iter().find(|r| r.status == state) {
            Some(row) => StateTotals {
                state,
                count: row.count,
                amount: row.amount.clone(),
                oldest_secs: row.oldest_secs.map(|s| s.max(0.0)),
            },
            None => StateTotals {
                state,
                count: 0,
                amount: "0".into(),
                oldest_secs: None,
            },
        })
        .collect();
    let (returned_count, returned_amount, conflicts, unknown_events, keys_awaiting_operator): (
        i64,
        String,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM settlement.payout_returns),
                (SELECT coalesce(sum(amount), 0)::text FROM settlement.payout_returns),
                (SELECT count(*) FROM settlement.payout_conflicts),
                (SELECT count(*) FROM settlement.provider_events WHERE outcome = 'unknown_payout'),
                (SELECT count(*) FROM settlement.provider_keys WHERE awaiting_operator_since IS NOT NULL)",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Overview {
        states,
        returned_count,
        returned_amount,
        conflicts,
        unknown_events,
        keys_awaiting_operator,
    })
}

/// A contradiction of a final state the provider raised, as recorded.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub(crate) struct Conflict {
    /// Its id.
    pub id: i64,
    /// The payout.
    pub payout_id: i64,
    /// The payout's state when it came.
    pub state: String,
    /// What the provider said (`paid`, `failed`, `pending`, or `missing`).
    pub provider_status: String,
    /// `delivery`, `webhook`, `poll` or `reconcile`.
    pub source: String,
    /// The webhook event, when one carried it.
    pub event_id: Option<String>,
    /// In words.
    pub detail: Option<String>,
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// The newest `limit` conflicts.
pub(crate) async fn conflicts(conn: &mut PgConnection, limit: i64) -> anyhow::Result<Vec<Conflict>> {
    Ok(sqlx::query_as(
        "SELECT id, payout_id, state, provider_status, source, event_id, detail, at
         FROM settlement.payout_conflicts ORDER BY id DESC LIMIT $1",
    )
    .bind(limit) // $1
    .fetch_all(conn)
    .await?)
}

/// A provider event for a payout settled does not know, kept for review.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub(crate) struct UnknownEvent {
    /// The event's id.
    pub id: String,
    /// Its type: `payment.paid` or `payment.failed`.
    pub kind: String,
    /// The key the payment was made under.
    pub provider_key: Option<String>,
    /// The payment's creator, as the event says.
    pub creator: Option<String>,
    /// The payment's amount, as the event says.
    pub amount: Option<String>,
    /// When settled received it.
    pub received_at: chrono::DateTime<chrono::Utc>,
}

/// The newest `limit` events for payouts settled does not know.
pub(crate) async fn unknown_events(conn: &mut PgConnection, limit: i64) -> anyhow::Result<Vec<UnknownEvent>> {
    Ok(sqlx::query_as(
        "SELECT id, type AS kind, provider_key, body #>> '{data,creator}' AS creator, body #>> '{data,amount}' AS amount,
                received_at
         FROM settlement.provider_events WHERE outcome = 'unknown_payout'
         ORDER BY received_at DESC, id LIMIT $1",
    )
    .bind(limit) // $1
    .fetch_all(conn)
    .await?)
}

/// A provider key waiting for an operator.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub(crate) struct KeyAwaiting {
    /// The key.
    pub key: String,
    /// The payout made under it, if settled has one (a settlement item
    /// paid before its payout row has none).
    pub payout_id: Option<i64>,
    /// Since when.
    pub since: chrono::DateTime<chrono::Utc>,
    /// What the provider answered.
    pub detail: String,
}

/// The `limit` provider keys waiting for an operator the longest.
pub(crate) async fn keys_awaiting_operator(conn: &mut PgConnection, limit: i64) -> anyhow::Result<Vec<KeyAwaiting>> {
    Ok(sqlx::query_as(
        "SELECT k.key, p.id AS payout_id, k.awaiting_operator_since AS since, k.awaiting_operator_detail AS detail
         FROM settlement.provider_keys k LEFT JOIN settlement.payouts p ON p.provider_key = k.key
         WHERE k.awaiting_operator_since IS NOT NULL
         ORDER BY k.awaiting_operator_since, k.key LIMIT $1",
    )
    .bind(limit) // $1
    .fetch_all(conn)
    .await?)
}
