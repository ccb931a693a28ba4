//! The leased-mode handler: each creator paid through the provider outside
//! any transaction, the payments recorded at the fenced completion.

use std::sync::Arc;

use settled_engine::ClaimedItem;
use settled_engine::{Chunk, HandlerError, LeasedHandler};
use sqlx::{PgConnection, PgPool};

use crate::money::Amount;
use crate::payouts::key_window::{self, Found, KeyUse};
use crate::period::Period;
use crate::provider::{payout_key, Payment, PaymentStatus, PayoutProvider, ProviderError};

use super::chunk::{held_creators, pay_chunk};
use super::chunk_period;

/// The settlement handler for leased mode: each creator is paid through the
/// provider (idempotency key from period and creator, the key its
/// reference too) outside any transaction; at completion, for the items
/// whose fence still holds, the ledger rows and balance credits, and each
/// payment as a payout of the credited reward (`kind = 'settlement'`,
/// debited at once) in the state the provider answered: `sent`, `paid`, or
/// `failed` with the reward back on the balance. A payment that fails or
/// comes back later (its webhook, a lookup) returns the reward to the
/// balance the same way, so money is never lost. A key first used longer
/// ago than the provider's key window is not sent under again before the
/// payment is found by its reference (`payouts::key_window`).
#[derive(Debug, Clone)]
pub struct SettleWithProvider<P> {
    /// The provider.
    pub provider: P,
    /// The provider's answers, by payout key, from the work to the
    /// completion (an answer lost on the way records the payment `sent`,
    /// and a lookup settles it).
    answers: Arc<std::sync::Mutex<std::collections::HashMap<String, (Payment, std::time::Instant)>>>,
    /// How long the provider keeps a key.
    key_window: std::time::Duration,
}

/// Answers kept at most this long for a completion (a completion refused
/// by the fence never takes its answer).
const ANSWER_KEPT: std::time::Duration = std::time::Duration::from_secs(3_600);

impl<P> SettleWithProvider<P> {
    /// A handler paying through `provider`, which keeps keys
    /// `key_window::DEFAULT_PROVIDER_KEY_WINDOW`.
    pub fn new(provider: P) -> SettleWithProvider<P> {
        SettleWithProvider {
            provider,
            answers: Arc::default(),
            key_window: key_window::DEFAULT_PROVIDER_KEY_WINDOW,
        }
    }

    /// The same handler, for a provider that keeps keys `window`.
    pub(crate) fn with_key_window(self, window: std::time::Duration) -> SettleWithProvider<P> {
        SettleWithProvider {
            key_window: window,
            ..self
        }
    }

    fn keep(&self, key: String, payment: Payment) {
        let mut answers = self.answers.lock().expect("answers");
        if answers.len() > 10_000 {
            answers.retain(|_, (_, at)| at.elapsed() < ANSWER_KEPT);
        }
        answers.insert(key, (payment, std::time::Instant::now()));
    }

    fn take(&self, key: &str) -> Option<Payment> {
        self.answers.lock().expect("answers").remove(key).map(|(p, _)| p)
    }
}

/// What leased settlement loads for a chunk.
pub struct LeasedBatch {
    period: Period,
    amounts: std::collections::HashMap<String, Amount>,
    held: Vec<String>,
    /// What settled knows of each payment key, its first use noted before
    /// any call under it.
    keys: std::collections::HashMap<String, KeyUse>,
    pool: PgPool,
}

#[derive(sqlx::FromRow)]
struct RewardRow {
    creator: String,
    reward: String,
}

impl<P: PayoutProvider> LeasedHandler for SettleWithProvider<P> {
    type Batch = LeasedBatch;

    fn held(&self, batch: &LeasedBatch) -> Vec<String> {
        batch.held.clone()
    }

    async fn prepare(&self, pool: &PgPool, chunk: &Chunk) -> Result<Self::Batch, HandlerError> {
        let period = chunk_period(chunk)?;
        let held = held_creators(pool, chunk).await?;
        let rows: Vec<RewardRow> = sqlx::query_as(
            "SELECT v.creator, settlement.reward(v.volume, p.fee_bps)::text AS reward
             FROM settlement.token_trade_volume v
             JOIN settlement.settlement_policy p ON p.period = v.period
             WHERE v.period = $1 AND v.creator = ANY($2)",
        )
        .bind(period.date()) // $1
        .bind(chunk.keys()) // $2
        .fetch_all(pool)
        .await?;
        let amounts = rows
            .into_iter()
            .map(|row| {
                Amount::parse_decimal(&row.reward)
                    .map(|a| (row.creator, a))
                    .map_err(|e| HandlerError::Permanent(format!("reward {:?} is not an amount: {e}", row.reward)))
            })
            .collect::<Result<_, _>>()?;
        let keys: Vec<String> = chunk
            .items
            .iter()
            .filter(|i| !held.contains(&i.key))
            .map(|i| payout_key(period, &i.key))
            .collect();
        let keys = key_window::note_uses(pool, &keys)
            .await
            .map_err(|e| HandlerError::Transient(format!("noting the chunk's payment keys: {e:#}")))?;
        Ok(LeasedBatch {
            period,
            amounts,
            held,
            keys,
            pool: pool.clone(),
        })
    }

    async fn work_item(&self, batch: &Self::Batch, chunk: &Chunk, item: &ClaimedItem) -> Result<(), HandlerError> {
        let amount = *batch.amounts.get(&item.key).ok_or_else(|| {
            HandlerError::Permanent(format!("creator {} has no reward for {}", item.key, chunk.scope))
        })?;
        let key = payout_key(batch.period, &item.key);
        if let Some(payment) = self.found_past_window(batch, &key, &item.key, amount).await? {
            self.keep(key, payment);
            return Ok(());
        }
        match self.provider.pay(&key, &item.key, amount, Some(&key)).await {
            Ok((payment, _)) => {
                self.keep(key, payment);
                Ok(())
            }
            Err(e) => Err(item_error(e)),
        }
    }

    async fn commit(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        let period = chunk_period(chunk)?;
        pay_chunk(tx, period, chunk).await?;
        record_payments(tx, period, chunk, |key| self.take(key)).await
    }
}

impl<P: PayoutProvider> SettleWithProvider<P> {
    /// Key `key`'s payment of `amount` to `creator`, found by its reference
    /// when the key is past the provider's key window; None when it is
    /// not past (or the provider certainly has none): the payment is sent.
    /// Err when nothing may be sent: the key waits for an operator (or the
    /// provider cannot answer now).
    async fn found_past_window(
        &self,
        batch: &LeasedBatch,
        key: &str,
        creator: &str,
        amount: Amount,
    ) -> Result<Option<Payment>, HandlerError> {
        // A key missing from the batch was not noted: taken as past the window.
        let noted = batch.keys.get(key).cloned().unwrap_or_else(KeyUse::unknown);
        if let Some(detail) = noted.awaiting_operator {
            return Err(HandlerError::Permanent(key_window::waits(key, &detail)));
        }
        // Asked right before the call: the chunk's items wait their turn.
        if !noted.past(self.key_window) {
            return Ok(None);
        }
        let detail = match key_window::judge(key, self.provider.find_by_reference(key).await) {
            Found::Nothing => return Ok(None),
            Found::Payment(payment) if key_window::is_owed(&payment, key, creator, amount) => return Ok(Some(payment)),
            Found::Later(error) => return Err(item_error(error)),
            Found::Payment(payment) => format!(
                "the provider's payment {} for reference {key:?} is not the one owed (under key {:?}, {} to {})",
                payment.id, payment.idempotency_key, payment.amount, payment.creator
            ),
            Found::CannotSay(detail) => detail,
        };
        key_window::await_operator(&batch.pool, key, &detail)
            .await
            .map_err(|e| HandlerError::Transient(format!("recording key {key}'s wait: {e:#}")))?;
        Err(HandlerError::Permanent(key_window::waits(key, &detail)))
    }
}

/// Records each paid item's payment as a payout of its reward (debited at
/// once), in the state `answer` gives (none: `sent`, for a lookup to
/// settle), on the completion's transaction, after its ledger rows and
/// credits of `period` (the chunk's scope). Rewards of zero pay nothing and
/// record nothing.
async fn record_payments(
    tx: &mut PgConnection,
    period: Period,
    chunk: &Chunk,
    answer: impl Fn(&str) -> Option<Payment>,
) -> Result<(), HandlerError> {
    let (mut creators, mut keys, mut ids, mut states, mut reasons) = (vec![], vec![], vec![], vec![], vec![]);
    for item in &chunk.items {
        let key = payout_key(period, &item.key);
        let payment = answer(&key);
        let (state, reason) = match payment.as_ref().map(|p| p.status) {
            Some(PaymentStatus::Paid) => ("paid", "paid at once".to_string()),
            Some(PaymentStatus::Failed) => (
                "failed",
                format!(
                    "failed: {}",
                    payment
                        .as_ref()
                        .and_then(|p| p.failure_reason.clone())
                        .unwrap_or_default()
                ),
            ),
            Some(PaymentStatus::Pending) => ("sent", "accepted by the provider".to_string()),
            // Found, long after, paid and returned: a look-up moves it on.
            Some(PaymentStatus::Returned) | None => {
                ("sent", "accepted by the provider; its answer is looked up".to_string())
            }
        };
        creators.push(item.key.clone());
        keys.push(key);
        ids.push(payment.map(|p| p.id));
        states.push(state);
        reasons.push(reason);
    }
    sqlx::query(&format!(
        "{} SELECT settlement.record_settlement_payment(l.creator, l.amount, l.period, a.key, a.id, a.state, a.reason)
         FROM mover, settlement.reward_ledger l
         JOIN unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS a(creator, key, id, state, reason)
           ON a.creator = l.creator
         WHERE l.period = $1 AND l.amount > 0",
        crate::payouts::with_mover(7)
    ))
    .bind(period.date()) // $1
    .bind(creators) // $2
    .bind(keys) // $3
    .bind(ids) // $4
    .bind(states) // $5
    .bind(reasons) // $6
    .bind(crate::payouts::MOVED_BY_SETTLEMENT) // $7
    .execute(tx)
    .await?;
    Ok(())
}

/// How a provider call that failed ends a settlement item's attempt: a
/// refusal or a key conflict fails it, a rate limit waits as asked, anything
/// else is retried later under the same key.
pub fn item_error(error: ProviderError) -> HandlerError {
    match error {
        ProviderError::Transient(e) => HandlerError::Transient(e),
        ProviderError::RateLimited { retry_after } => HandlerError::Snooze {
            after: retry_after,
            reason: error.to_string(),
        },
        ProviderError::Refused(e) | ProviderError::KeyConflict(e) => HandlerError::Permanent(e),
    }
}
