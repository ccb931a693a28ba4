//! The payout lifecycle: one state machine over every payout (withdrawals
//! through the API, and settlements paid through the provider), its moves,
//! and what the provider's word does to it.
//!
//! ```text
//! created ──► queued ──► sent ──► paid ──► returned  (funds returned)
//!    │           │         ├────► failed             (funds returned)
//!    │           │         └────► returned           (returned before its paid was heard)
//!    │           ├──────────────► paid | failed | returned
//!    ├──► cancelled (funds returned)
//!    └──► expired   (funds returned: never confirmed)
//! ```
//!
//! The database holds the rules (migrations `20261203000501`,
//! `20261205000102` and `20261205000501`): the allowed transitions are a
//! table a trigger checks, every transition appends a history row, and a
//! payout that ends without paying for good (failed, returned by the
//! provider after it paid, cancelled, expired) gets its amount back on the
//! balance in the same transaction, once (the return's primary key). Each move is a one-purpose function of the
//! database, whose answer is the truth: `settlement.confirm_payout` and
//! `cancel_payout` (the API), `apply_provider_word` (the provider's word,
//! from webhooks, delivery and polling), `fail_refused_payout` (delivery);
//! nothing is decided from a state read earlier. `settlement.move_payout`,
//! which makes any allowed move, is the owner's alone.
//!
//! Beside the moves: a payout as settled reads it (`row.rs`: one typed
//! row, one column list), what a rail's answer means for it (`word.rs`),
//! the one interface delivery calls a rail through (`rail.rs`), delivery
//! itself (`deliver.rs`), reconciliation (`reconcile/`) and what
//! operators watch (`overview.rs`).

use crate::provider::Payment;
use sqlx::PgConnection;

pub mod deliver;
pub(crate) mod find;
pub(crate) mod key_window;
pub mod limiter;
pub(crate) mod overview;
pub mod poll;
pub(crate) mod rail;
pub(crate) mod reconcile;
pub mod row;
pub mod word;

pub use rail::Rail;
pub(crate) use row::PayoutKind;
pub use row::{PayoutRow, PAYOUT_COLUMNS};
pub use word::ProviderWord;

/// The delivery queue's name (a continuous queue of the engine).
pub(crate) const DELIVERY_QUEUE: &str = "payout_delivery";
/// Its table: one job per queued payout, keyed by the payout's id.
pub(crate) const DELIVERY_TABLE: &str = "settlement.payout_jobs";
/// What a confirmation token is for (the purpose of its one-time token;
/// `settlement.confirm_payout` redeems it for this purpose).
pub const CONFIRMATION_PURPOSE: &str = "payout-confirmation";
/// How long a payout waits for its confirmation by default.
pub(crate) const DEFAULT_CONFIRM_TTL_SECS: u64 = 900;
/// Longest confirmation window allowed.
pub(crate) const MAX_CONFIRM_TTL_SECS: u64 = 7 * 24 * 3600;

/// The delivery queue.
pub fn delivery_queue() -> settled_engine::Queue {
    settled_engine::Queue::with_key(DELIVERY_QUEUE, DELIVERY_TABLE, "payout_id", "bigint")
        .expect("the delivery queue's names are valid")
}

/// Where a payout stands (the API serializes it, and the OpenAPI document
/// lists its values, from this enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PayoutState {
    /// Debited, awaiting its confirmation.
    Created,
    /// Debited, its delivery job committed with it.
    Queued,
    /// Accepted by the provider, not yet paid.
    Sent,
    /// Paid (final, unless the provider takes it back: [`PayoutState::Returned`]).
    Paid,
    /// The provider refused or failed it; funds returned (final).
    Failed,
    /// The provider paid it and it came back (a bank's return; `failed`
    /// after `paid` from a provider without a returned status); funds
    /// returned (final).
    Returned,
    /// Cancelled before confirmation; funds returned (final).
    Cancelled,
    /// Never confirmed; funds returned (final).
    Expired,
}

impl PayoutState {
    /// Every state.
    pub const ALL: [PayoutState; 8] = [
        PayoutState::Created,
        PayoutState::Queued,
        PayoutState::Sent,
        PayoutState::Paid,
        PayoutState::Failed,
        PayoutState::Returned,
        PayoutState::Cancelled,
        PayoutState::Expired,
    ];

    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            PayoutState::Created => "created",
            PayoutState::Queued => "queued",
            PayoutState::Sent => "sent",
            PayoutState::Paid => "paid",
            PayoutState::Failed => "failed",
            PayoutState::Returned => "returned",
            PayoutState::Cancelled => "cancelled",
            PayoutState::Expired => "expired",
        }
    }

    /// Parses a stored value.
    pub fn parse(value: &str) -> Option<PayoutState> {
        PayoutState::ALL.into_iter().find(|s| s.as_str() == value)
    }

    /// True for the states whose funds came back to the balance (once,
    /// in the transaction that moved the payout there).
    pub fn returns_funds(self) -> bool {
        matches!(
            self,
            PayoutState::Failed | PayoutState::Returned | PayoutState::Cancelled | PayoutState::Expired
        )
    }
}

impl std::fmt::Display for PayoutState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fails queued payout `id` on the provider's refusal (its funds return in
/// the same transaction); false when it was not queued.
pub async fn fail_refused(conn: &mut PgConnection, id: i64, reason: &str) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(&format!(
        "{} SELECT settlement.fail_refused_payout($1, $2) FROM mover",
        with_mover(3)
    ))
    .bind(id) // $1
    .bind(reason) // $2
    .bind(Source::Delivery.mover()) // $3
    .fetch_one(conn)
    .await?)
}

/// Records a clash of the provider's payment `payment_id` with payout
/// `id` (another payout holds that id, or the payout records another one)
/// as a conflict, and says what clashed; None when nothing does.
pub(crate) async fn record_payment_clash(
    conn: &mut PgConnection,
    id: i64,
    payment_id: &str,
    provider_status: &str,
    source: Source,
) -> anyhow::Result<Option<String>> {
    Ok(
        sqlx::query_scalar("SELECT settlement.record_payment_clash($1, $2, $3, $4, NULL)")
            .bind(id) // $1
            .bind(payment_id) // $2
            .bind(provider_status) // $3
            .bind(source.as_str()) // $4
            .fetch_one(conn)
            .await?,
    )
}

/// Where the provider's word came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The delivery call's answer.
    Delivery,
    /// A webhook event.
    Webhook,
    /// A lookup of a payout sent long ago.
    Poll,
    /// `settled reconcile`.
    Reconcile,
}

/// A statement's prefix that names the mover of the payouts it moves, in
/// the transaction-local setting `settled.moved_by` that the history's
/// trigger copies (migration `20261206002001`): the CTE is read before the
/// statement's target list, so it is set before any move. `param` is the
/// number of its bind; the statement reads `FROM mover`.
pub(crate) fn with_mover(param: usize) -> String {
    format!("WITH mover AS MATERIALIZED (SELECT set_config('settled.moved_by', ${param}, true))")
}

/// The mover of payouts that expire unconfirmed.
pub(crate) const MOVED_BY_EXPIRY: &str = "expiry";
/// The mover of payouts a settlement run makes (leased mode).
pub(crate) const MOVED_BY_SETTLEMENT: &str = "settlement run";
/// The mover of payouts moved through the API (with the token's name, when it has one).
pub(crate) const MOVED_BY_API: &str = "api";

impl Source {
    /// Who moved a payout on this source's word, as its history says.
    pub(crate) fn mover(self) -> &'static str {
        match self {
            Source::Delivery => "deliverer",
            Source::Webhook => "webhook",
            Source::Poll => "look-up",
            Source::Reconcile => "reconcile",
        }
    }

    /// Every source (the values `settlement.payout_conflicts.source` allows).
    pub const ALL: [Source; 4] = [Source::Delivery, Source::Webhook, Source::Poll, Source::Reconcile];

    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Delivery => "delivery",
            Source::Webhook => "webhook",
            Source::Poll => "poll",
            Source::Reconcile => "reconcile",
        }
    }
}

/// What the provider's word did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    /// The payout moved.
    Moved,
    /// It said nothing new (a repeat, or a late `pending`).
    Already,
    /// It contradicts the payout's final state: recorded, not applied.
    Conflict,
}

impl Applied {
    /// Every outcome of applying a word (stored as a webhook event's outcome).
    pub const ALL: [Applied; 3] = [Applied::Moved, Applied::Already, Applied::Conflict];

    /// The stored outcome of a webhook event.
    pub fn as_str(self) -> &'static str {
        match self {
            Applied::Moved => "applied",
            Applied::Already => "already",
            Applied::Conflict => "conflict",
        }
    }

    /// Reads `settlement.apply_provider_word`'s answer.
    fn parse(outcome: &str) -> Option<Applied> {
        [Applied::Moved, Applied::Already, Applied::Conflict]
            .into_iter()
            .find(|a| a.as_str() == outcome)
    }
}

/// Applies the provider's word about payout `id` on `conn`, through
/// `settlement.apply_provider_word`: each possible move is a conditional
/// update, so a repeat or a late event changes nothing; a word that
/// contradicts the payout (a final state, a payout still awaiting its
/// confirmation, a payment id another payout holds or other than the one
/// recorded) is recorded as a conflict and never applied.
pub async fn apply_word(
    conn: &mut PgConnection,
    id: i64,
    word: &ProviderWord,
    source: Source,
    event_id: Option<&str>,
) -> anyhow::Result<Applied> {
    let applied = apply_words(conn, &[(id, word.clone())], source, event_id).await?;
    Ok(applied[0])
}

/// Applies the provider's word about each of `words`' payouts, as
/// [`apply_word`] does one, in one statement: each payout by its own
/// conditional update, in the order of `words` (callers that may run at
/// once pass their payouts in one order, by id). Their outcomes, in that
/// order.
pub(crate) async fn apply_words(
    conn: &mut PgConnection,
    words: &[(i64, ProviderWord)],
    source: Source,
    event_id: Option<&str>,
) -> anyhow::Result<Vec<Applied>> {
    let mut ids = Vec::with_capacity(words.len());
    let (mut statuses, mut provider_ids, mut reasons) = (Vec::new(), Vec::new(), Vec::new());
    for (id, word) in words {
        let provider_status = word.provider_status();
        let Some(provider_id) = word.provider_id() else {
            anyhow::bail!("the provider's word {provider_status} about payout {id} names no payment");
        };
        let what = match word {
            ProviderWord::Pending { .. } => "accepted by the provider".to_string(),
            ProviderWord::Paid { .. } => "paid".to_string(),
            ProviderWord::Failed { reason, .. } => format!("failed: {reason}"),
            ProviderWord::Returned { reason, .. } => format!("returned: {reason}"),
        };
        ids.push(*id);
        statuses.push(provider_status);
        provider_ids.push(provider_id.to_string());
        reasons.push(format!(
            "{what} ({})",
            event_id.map_or(source.as_str().to_string(), |e| format!("event {e}"))
        ));
    }
    let outcomes: Vec<String> = sqlx::query_scalar(&format!(
        "{} SELECT settlement.apply_provider_word(w.id, w.status, w.provider_id, w.reason, $5, $6)
         FROM mover, unnest($1::bigint[], $2::text[], $3::text[], $4::text[])
              WITH ORDINALITY AS w(id, status, provider_id, reason, position)
         ORDER BY w.position",
        with_mover(7)
    ))
    .bind(&ids) // $1
    .bind(&statuses) // $2
    .bind(&provider_ids) // $3
    .bind(&reasons) // $4
    .bind(source.as_str()) // $5
    .bind(event_id) // $6
    .bind(source.mover()) // $7
    .fetch_all(&mut *conn)
    .await?;
    anyhow::ensure!(
        outcomes.len() == words.len(),
        "settlement.apply_provider_word answered {} times for {} payouts",
        outcomes.len(),
        words.len()
    );
    let mut applied = Vec::with_capacity(outcomes.len());
    for ((id, word), outcome) in words.iter().zip(&outcomes) {
        let one = Applied::parse(outcome)
            .ok_or_else(|| anyhow::anyhow!("settlement.apply_provider_word answered {outcome:?}"))?;
        if one == Applied::Conflict {
            tracing::warn!(
                payout = id,
                provider_status = word.provider_status(),
                provider_id = word.provider_id(),
                source = source.as_str(),
                "the provider's word contradicts its payout; recorded, not applied"
            );
        }
        applied.push(one);
    }
    Ok(applied)
}

/// Checks that the provider's `payment` given for payout `id`'s key is
/// under that key and pays what the payout says. When it does not, nothing
/// is applied: the difference is recorded in `settlement.payout_conflicts`
/// for operators (and `settled reconcile` names it), and the answer is
/// false. A payment under another key, or that pays someone else or
/// another amount, never makes a payout paid or failed.
pub(crate) async fn payment_matches(
    conn: &mut PgConnection,
    id: i64,
    payment: &Payment,
    source: Source,
    event_id: Option<&str>,
) -> anyhow::Result<bool> {
    let payout = row::load(conn, id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("payout {id} does not exist"))?;
    let Some(detail) = word::differs(&payout, payment) else {
        return Ok(true);
    };
    sqlx::query(
        "INSERT INTO settlement.payout_conflicts (payout_id, state, provider_status, source, event_id, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id) // $1
    .bind(payout.state.as_str()) // $2
    .bind(payment.status.as_str()) // $3
    .bind(source.as_str()) // $4
    .bind(event_id) // $5
    .bind(format!("{detail}: not applied")) // $6
    .execute(&mut *conn)
    .await?;
    tracing::warn!(
        payout = id,
        state = payout.state.as_str(),
        source = source.as_str(),
        detail,
        "the provider's payment does not match its payout; recorded, not applied"
    );
    Ok(false)
}

/// The payout whose provider key is `key`, if settled made one.
pub async fn by_provider_key(conn: &mut PgConnection, key: &str) -> anyhow::Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM settlement.payouts WHERE provider_key = $1")
            .bind(key) // $1
            .fetch_optional(conn)
            .await?,
    )
}

/// The W3C trace context stored with payout `id` (its request's), if any.
pub(crate) async fn traceparent_of(conn: &mut PgConnection, id: i64) -> anyhow::Result<Option<String>> {
    Ok(
        sqlx::query_scalar("SELECT traceparent FROM settlement.payouts WHERE id = $1")
            .bind(id) // $1
            .fetch_optional(conn)
            .await?
            .flatten(),
    )
}

/// Expires up to `batch` payouts whose confirmation window has passed
/// (funds returned); returns how many.
pub(crate) async fn expire_unconfirmed(conn: &mut PgConnection, batch: i32) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(&format!(
        "{} SELECT settlement.expire_unconfirmed_payouts($1) FROM mover",
        with_mover(2)
    ))
    .bind(batch) // $1
    .bind(MOVED_BY_EXPIRY) // $2
    .fetch_one(conn)
    .await?)
}
