//! What the lab puts around the product's real handlers: simulated
//! per-item work, and a provider that pays nothing outside. Layers, never
//! modes of the production handlers: `settled worker` cannot reach them.
//! A leased handler's layer goes around each item's work ([`Layered`],
//! which the models' replays use for their own stops).

use std::future::Future;
use std::time::Duration;

use settled::money::Amount;
use settled::provider::{HttpProvider, Payment, PaymentStatus, PayoutProvider, ProviderError};
use settled::settlement::{SettleRewards, SettleWithProvider};
use settled::worker::Mode;
use settled_engine::{ByMode, ClaimedItem};
use settled_engine::{Chunk, ChunkHandler, Handled, HandlerError, InTransaction, LeaseConfig, Leased, LeasedHandler};
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;

/// Largest simulated per-item work, in milliseconds.
pub const MAX_WORK_MS: u64 = 60_000;

/// An in-transaction handler with simulated work per item, after the
/// chunk's writes and before the commit (the widest window for a crash to
/// leave something half written: it must not). Leased mode's is
/// [`PerItemWork`], a [`Layered`] layer.
#[derive(Debug, Clone)]
pub struct SimulatedWork<H> {
    /// The real handler.
    pub inner: H,
    /// Work per item.
    pub per_item: Duration,
}

impl<H: ChunkHandler> ChunkHandler for SimulatedWork<H> {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        let handled = self.inner.handle_chunk(tx, chunk).await?;
        if !self.per_item.is_zero() {
            tokio::time::sleep(self.per_item * chunk.items.len() as u32).await;
        }
        Ok(handled)
    }

    /// Without simulated work, the real handler's one-statement chunks (the
    /// product's path); with it, `handle_chunk`, where the work can sit.
    fn chunk_sql(&self) -> Option<settled_engine::ChunkSql> {
        if self.per_item.is_zero() {
            self.inner.chunk_sql()
        } else {
            None
        }
    }
}

/// What a layer does around each item's work in leased mode; everything
/// else (prepare, held, commit) stays the inner handler's.
pub trait ItemLayer: Send + Sync + 'static {
    /// Runs `work`, the inner handler's work on `item` (not started until
    /// awaited), with the layer around it.
    fn around<W>(&self, item: &ClaimedItem, work: W) -> impl Future<Output = Result<(), HandlerError>> + Send
    where
        W: Future<Output = Result<(), HandlerError>> + Send;
}

/// A leased handler: `inner` with `layer` around each item's work.
#[derive(Debug, Clone)]
pub struct Layered<H, L> {
    /// The real handler.
    pub inner: H,
    /// What goes around each item's work.
    pub layer: L,
}

impl<H: LeasedHandler, L: ItemLayer> LeasedHandler for Layered<H, L> {
    type Batch = H::Batch;

    async fn prepare(&self, pool: &PgPool, chunk: &Chunk) -> Result<Self::Batch, HandlerError> {
        self.inner.prepare(pool, chunk).await
    }

    fn held(&self, batch: &Self::Batch) -> Vec<String> {
        self.inner.held(batch)
    }

    async fn work_item(&self, batch: &Self::Batch, chunk: &Chunk, item: &ClaimedItem) -> Result<(), HandlerError> {
        self.layer.around(item, self.inner.work_item(batch, chunk, item)).await
    }

    async fn commit(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        self.inner.commit(tx, chunk).await
    }
}

/// Simulated work per item in leased mode: before each item's real work,
/// outside any transaction.
#[derive(Debug, Clone, Copy)]
pub struct PerItemWork(pub Duration);

impl ItemLayer for PerItemWork {
    async fn around<W>(&self, _item: &ClaimedItem, work: W) -> Result<(), HandlerError>
    where
        W: Future<Output = Result<(), HandlerError>> + Send,
    {
        if !self.0.is_zero() {
            tokio::time::sleep(self.0).await;
        }
        work.await
    }
}

/// The lab's payment provider: a real one over HTTP, or none (leased mode
/// that pays nothing outside the database, to measure the engine alone).
#[derive(Debug, Clone)]
pub enum LabProvider {
    /// A provider over HTTP (the simulator, in chaos runs).
    Http(HttpProvider),
    /// Nothing outside: every payment "succeeds" at once.
    Nothing,
}

impl PayoutProvider for LabProvider {
    async fn pay(
        &self,
        key: &str,
        creator: &str,
        amount: Amount,
        reference: Option<&str>,
    ) -> Result<(Payment, bool), ProviderError> {
        match self {
            LabProvider::Http(http) => http.pay(key, creator, amount, reference).await,
            LabProvider::Nothing => Ok((
                Payment {
                    // One id per key, as a provider's ids are unique.
                    id: format!("lab-{key}"),
                    idempotency_key: key.to_string(),
                    creator: creator.to_string(),
                    amount: amount.to_string(),
                    status: PaymentStatus::Paid,
                    failure_reason: None,
                    reference: reference.map(str::to_string),
                },
                true,
            )),
        }
    }

    /// Nothing outside records a payment, so none is found.
    async fn lookup(&self, key: &str) -> Result<Option<Payment>, ProviderError> {
        match self {
            LabProvider::Http(http) => http.lookup(key).await,
            LabProvider::Nothing => Ok(None),
        }
    }

    /// Nothing outside records a payment, so none is found.
    async fn find_by_reference(&self, reference: &str) -> Result<Vec<Payment>, ProviderError> {
        match self {
            LabProvider::Http(http) => http.find_by_reference(reference).await,
            LabProvider::Nothing => Ok(Vec::new()),
        }
    }
}

/// The lab's drainer: the product's handlers with simulated work per item
/// ([`SimulatedWork`], [`PerItemWork`]).
pub type LabDrainer = ByMode<SimulatedWork<SettleRewards>, Layered<SettleWithProvider<LabProvider>, PerItemWork>>;

/// Builds the lab's drainer; leased mode without `provider_url` pays nothing outside.
pub fn drainer(
    mode: Mode,
    provider_url: Option<&str>,
    provider_timeout: Duration,
    leases: LeaseConfig,
    per_item: Duration,
) -> anyhow::Result<LabDrainer> {
    anyhow::ensure!(
        per_item <= Duration::from_millis(MAX_WORK_MS),
        "--work-ms must be at most {MAX_WORK_MS}"
    );
    Ok(match mode {
        Mode::Tx => ByMode::InTransaction(InTransaction(Arc::new(SimulatedWork {
            inner: SettleRewards,
            per_item,
        }))),
        Mode::Leased => {
            let provider = match provider_url {
                Some(url) => LabProvider::Http(HttpProvider::new(url, provider_timeout)?),
                None => LabProvider::Nothing,
            };
            ByMode::Leased(Leased {
                handler: Arc::new(Layered {
                    inner: SettleWithProvider::new(provider),
                    layer: PerItemWork(per_item),
                }),
                leases,
            })
        }
    })
}
