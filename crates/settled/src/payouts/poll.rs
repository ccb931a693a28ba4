//! The look-ups beside delivery: payouts the provider accepted long ago and
//! still not paid or failed (a lost webhook), and those paid within the
//! returns watch (a return whose webhook was lost), are looked up and
//! moved by the provider's answer. Past the provider's key window a payout
//! is found by its reference, not its key (`key_window.rs`).

use std::time::Duration;

use sqlx::PgPool;

use super::key_window::{self, Found};
use super::{apply_word, word, PayoutRow, Rail, Source};
use crate::provider::Payment;

/// What the look-ups beside delivery look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polling {
    /// A payout the provider accepted this long ago (or last asked about
    /// that long ago) and still not paid or failed is looked up (its
    /// webhook lost).
    pub sent_after: Duration,
    /// A paid payout is looked up again this often (a return whose webhook
    /// was lost) ...
    pub paid_every: Duration,
    /// ... for this long after it was paid.
    pub returns_watch: Duration,
    /// How long the provider keeps a key: past it, a payout is looked up
    /// by its reference, not its key.
    pub key_window: Duration,
}

/// A payout due for a look-up.
#[derive(sqlx::FromRow)]
struct Due {
    #[sqlx(flatten)]
    payout: PayoutRow,
    /// How long ago its key was first used (None: not recorded).
    key_age_ms: Option<i64>,
}

const fn millis(d: Duration) -> i64 {
    let ms = d.as_millis();
    if ms > i64::MAX as u128 {
        i64::MAX
    } else {
        ms as i64
    }
}

/// Payouts due for a look-up (see [`Polling`]), up to `batch` of the sent
/// and `batch` of the paid, looked up on their rail and moved by its
/// answer (a paid one returned, say); the number looked up. A payout the
/// rail has no record of, or whose key is past the window and the rail
/// cannot say, is recorded as a conflict for operators.
pub async fn poll<R: Rail>(pool: &PgPool, rail: &R, polling: &Polling, batch: i64) -> anyhow::Result<usize> {
    let due: Vec<Due> = sqlx::query_as(&format!(
        "WITH due_sent AS (
             SELECT id FROM settlement.payouts
             WHERE status = 'sent' AND coalesce(polled_at, sent_at) < now() - $1 * interval '1 millisecond'
             ORDER BY coalesce(polled_at, sent_at) LIMIT $3
             FOR NO KEY UPDATE SKIP LOCKED),
         due_paid AS (
             SELECT id FROM settlement.payouts
             WHERE status = 'paid' AND coalesce(polled_at, finished_at) < now() - $2 * interval '1 millisecond'
               AND coalesce(polled_at, finished_at) > now() - $4 * interval '1 millisecond'
               AND finished_at > now() - $4 * interval '1 millisecond'
             ORDER BY coalesce(polled_at, finished_at) LIMIT $3
             FOR NO KEY UPDATE SKIP LOCKED)
         UPDATE settlement.payouts p SET polled_at = now()
         WHERE p.id IN (SELECT id FROM due_sent UNION ALL SELECT id FROM due_paid)
         RETURNING {},
                   (SELECT (extract(epoch FROM clock_timestamp() - k.first_used_at) * 1000)::bigint
                    FROM settlement.provider_keys k WHERE k.key = p.provider_key) AS key_age_ms",
        super::PAYOUT_COLUMNS
    ))
    .bind(millis(polling.sent_after)) // $1
    .bind(millis(polling.paid_every)) // $2
    .bind(batch) // $3
    .bind(millis(polling.returns_watch)) // $4
    .fetch_all(pool)
    .await?;
    let read_at = std::time::Instant::now();
    for Due { payout, key_age_ms } in &due {
        let key_use = match key_age_ms {
            Some(ms) => key_window::KeyUse {
                age: Duration::from_millis((*ms).max(0) as u64),
                read_at,
                awaiting_operator: None,
            },
            None => key_window::KeyUse::unknown(),
        };
        // Judged right before the look-up: a batch's look-ups take a while.
        let past = key_use.past(polling.key_window);
        let Some(payment) = look_up(pool, rail, payout, past).await? else {
            continue;
        };
        let mut tx = pool.begin().await?;
        if super::payment_matches(&mut tx, payout.id, &payment, Source::Poll, None).await? {
            apply_word(&mut tx, payout.id, &word::word_of(&payment), Source::Poll, None).await?;
        }
        tx.commit().await?;
    }
    Ok(due.len())
}

/// `payout`'s payment at the rail: by its key, or by its reference once the
/// key may be forgotten. None when there is none (recorded as a conflict),
/// or no answer now (asked again later).
async fn look_up<R: Rail>(
    pool: &PgPool,
    rail: &R,
    payout: &PayoutRow,
    key_past_window: bool,
) -> anyhow::Result<Option<Payment>> {
    let id = payout.id;
    let (found, missing) = if key_past_window {
        let found = key_window::judge(&payout.reference, rail.find(payout).await);
        (found, "the provider has no payment for this payout's reference")
    } else {
        let found = match rail.look_up(payout).await {
            Ok(Some(payment)) => Found::Payment(payment),
            Ok(None) => Found::Nothing,
            Err(err) => Found::Later(err),
        };
        (found, "the provider has no payment under this payout's key")
    };
    match found {
        Found::Payment(payment) => return Ok(Some(payment)),
        Found::Nothing => record_unknown(pool, payout, "missing", missing).await?,
        Found::CannotSay(detail) => record_unknown(pool, payout, "unknown", &detail).await?,
        Found::Later(err) => {
            tracing::warn!(payout = id, state = %payout.state, error = %err, "looking up a payout failed; asking again later")
        }
    }
    Ok(None)
}

/// A payout the provider does not know (`missing`), or cannot say it
/// knows (`unknown`): a conflict for operators, recorded once.
async fn record_unknown(pool: &PgPool, payout: &PayoutRow, provider_status: &str, detail: &str) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO settlement.payout_conflicts (payout_id, state, provider_status, source, detail)
         SELECT $1, $2, $3, 'poll', $4
         WHERE NOT EXISTS (SELECT 1 FROM settlement.payout_conflicts
                           WHERE payout_id = $1 AND provider_status = $3)",
    )
    .bind(payout.id) // $1
    .bind(payout.state.as_str()) // $2
    .bind(provider_status) // $3
    .bind(detail) // $4
    .execute(pool)
    .await?;
    tracing::warn!(
        payout = payout.id,
        state = %payout.state,
        detail,
        "the provider does not know a payout, or cannot say; recorded as a conflict"
    );
    Ok(())
}
