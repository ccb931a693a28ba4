//! The chain as a [`Rail`]: delivery asks it to pay a payout, and it signs
//! the payout's one transaction ahead (unless it has one), broadcasts that
//! transaction's stored bytes, and answers with the payment as the chain
//! rail records it: pending until the transaction is confirmed at depth,
//! paid, or failed if it reverted. Asked again (a retry, another process,
//! after a crash), it broadcasts the same bytes. It reads its record from
//! the database: the chain rail never forgets a payment.

use std::sync::Arc;

use sqlx::PgPool;

use super::broadcast::{self, Sent};
use super::store::{self, ChainTx, Paid, TxState};
use super::Chain;
use crate::payouts::{PayoutRow, Rail};
use crate::provider::{Payment, PaymentStatus, ProviderError};

/// The chain rail.
#[derive(Debug, Clone)]
pub struct ChainRail {
    chain: Arc<Chain>,
    pool: PgPool,
    /// One task of this process signs at a time: the others wait here, not
    /// on the database's nonce row, and most find their payout in the batch
    /// the task before them signed.
    signing: Arc<tokio::sync::Mutex<()>>,
}

fn transient(e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Transient(format!("{e:#}"))
}

impl ChainRail {
    /// The rail paying on `chain`, recording in `pool`'s database.
    pub fn new(chain: Arc<Chain>, pool: PgPool) -> ChainRail {
        ChainRail {
            chain,
            pool,
            signing: Arc::default(),
        }
    }

    async fn stored(&self, payout_id: i64) -> anyhow::Result<Option<(ChainTx, Paid)>> {
        let mut conn = self.pool.acquire().await?;
        store::tx_of_payout(&mut conn, payout_id).await
    }

    /// The payout's transaction: the stored one, or one signed now. A
    /// payout found in a batch signed before its job came means the jobs
    /// are behind the signing: the next batch is signed ahead of them
    /// ([`ChainRail::sign_ahead`]).
    async fn tx_for(&self, payout: &PayoutRow) -> Result<(ChainTx, Paid), ProviderError> {
        if let Some(found) = self.stored(payout.id).await.map_err(transient)? {
            self.sign_ahead();
            return Ok(found);
        }
        let _signer = self.signing.lock().await;
        if let Some(found) = self.stored(payout.id).await.map_err(transient)? {
            return Ok(found);
        }
        let fees = self.chain.recent_fees().await.map_err(transient)?;
        // None: another process signed for it first, or it left `queued`.
        super::sign::sign_ahead(&self.pool, &self.chain, payout, fees)
            .await
            .map_err(transient)?;
        self.stored(payout.id)
            .await
            .map_err(transient)?
            .ok_or_else(|| ProviderError::Refused(format!("payout {} is no longer queued", payout.id)))
    }

    /// With a batch contract, unless this process is signing already:
    /// signs the next batches of queued payouts that have no transaction
    /// and broadcasts each, one after another in the background, until
    /// none is left or [`super::sign::AHEAD_MAX_UNMINED`] are unmined
    /// ([`super::sign::sign_next`]). A failure is logged; the payouts' own
    /// jobs sign them.
    fn sign_ahead(&self) {
        if self.chain.batch.is_none() {
            return;
        }
        let Ok(signer) = self.signing.clone().try_lock_owned() else {
            return;
        };
        let rail = self.clone();
        tokio::spawn(async move {
            let _signer = signer;
            if let Err(err) = rail.sign_next().await {
                tracing::warn!(error = %format!("{err:#}"), "signing a batch ahead of its jobs failed; they sign it");
            }
        });
    }

    async fn sign_next(&self) -> anyhow::Result<()> {
        loop {
            let fees = self.chain.recent_fees().await?;
            let Some(tx_id) = super::sign::sign_next(&self.pool, &self.chain, fees).await? else {
                return Ok(());
            };
            let mut conn = self.pool.acquire().await?;
            let tx = store::tx(&mut conn, tx_id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("transaction {tx_id}, signed, is gone"))?;
            drop(conn);
            if !self.broadcast(&tx).await? {
                return Ok(());
            }
        }
    }

    /// Sends `tx`, signed and never sent, and records it sent; or gives it
    /// up when the node refuses it as never valid (false).
    async fn broadcast(&self, tx: &ChainTx) -> anyhow::Result<bool> {
        match broadcast::send(&self.chain.rpc, &tx.latest().raw).await? {
            Sent::NonceUsed => tracing::info!(
                tx = tx.id,
                nonce = tx.nonce,
                "nonce spent: an attempt was mined; the follower finds it"
            ),
            Sent::NeverValid(why) => {
                super::give_up::give_up(&self.pool, &self.chain, tx, &why).await?;
                return Ok(false);
            }
            Sent::Accepted | Sent::AlreadyKnown => {}
        }
        let mut conn = self.pool.acquire().await?;
        store::mark_broadcast(&mut conn, tx.id).await?;
        Ok(true)
    }

    /// The payment as this rail records it.
    fn payment(&self, payout: &PayoutRow, tx: &ChainTx, paid: &Paid) -> Payment {
        let status = match tx.state {
            TxState::Signed | TxState::Broadcast | TxState::Included | TxState::Filled => PaymentStatus::Pending,
            TxState::Confirmed => PaymentStatus::Paid,
            TxState::Reverted => PaymentStatus::Failed,
        };
        Payment {
            id: self.chain.payment_id(paid.payout_id),
            idempotency_key: payout.provider_key.clone(),
            creator: store::lower(paid.recipient),
            amount: paid.amount.to_string(),
            status,
            failure_reason: (status == PaymentStatus::Failed).then(|| reverted_reason(tx)),
            reference: Some(payout.reference.clone()),
        }
    }
}

/// Why a reverted transaction's payouts failed.
pub(crate) fn reverted_reason(tx: &ChainTx) -> String {
    match tx.mined {
        Some((block, _, hash)) => format!("transaction {hash} (nonce {}) reverted in block {block}", tx.nonce),
        None => format!("transaction nonce {} reverted", tx.nonce),
    }
}

impl Rail for ChainRail {
    const RATE_LIMITED: bool = false;
    const KEYS_EXPIRE: bool = false;

    async fn send(&self, payout: &PayoutRow, _traceparent: Option<&str>) -> Result<Payment, ProviderError> {
        let (tx, paid) = self.tx_for(payout).await?;
        // Only a transaction never sent is sent here: a batch's other
        // payouts find it broadcast and send nothing (one send per
        // transaction, not per payout it pays). One sent and not mined is
        // sent again by the follower ([`super::confirm`]) once it has
        // waited [`super::REBROADCAST_AFTER`]: a node that dropped or forgot it.
        if tx.state == TxState::Signed {
            self.broadcast(&tx).await.map_err(transient)?;
        }
        Ok(self.payment(payout, &tx, &paid))
    }

    async fn look_up(&self, payout: &PayoutRow) -> Result<Option<Payment>, ProviderError> {
        let found = self.stored(payout.id).await.map_err(transient)?;
        Ok(found.map(|(tx, paid)| self.payment(payout, &tx, &paid)))
    }

    async fn find(&self, payout: &PayoutRow) -> Result<Vec<Payment>, ProviderError> {
        Ok(self.look_up(payout).await?.into_iter().collect())
    }
}
