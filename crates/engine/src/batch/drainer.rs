//! How a worker drains a run: in transactions ([`InTransaction`]), with
//! leases ([`Leased`]), or either, chosen at run time ([`ByMode`]); each a
//! [`Drainer`] that [`crate::Job::work`] drives over a [`RunTarget`].

use std::future::Future;
use std::sync::Arc;

use sqlx::PgPool;
use uuid::Uuid;

use crate::batch::drain::{drain_in_transactions, ChunkHandler};
use crate::batch::leased::{drain_leased, LeasedHandler};
use crate::batch::queue::WorkQueue;
use crate::batch::stats::{DrainConfig, DrainStats};
use crate::common::error::EngineError;
use crate::common::lease::LeaseConfig;

/// What a drain works on: the run and scope, who works, and how.
#[derive(Debug, Clone, Copy)]
pub struct RunTarget<'a> {
    /// The database.
    pub pool: &'a PgPool,
    /// The work table.
    pub queue: &'a Arc<WorkQueue>,
    /// The run.
    pub run_id: i64,
    /// Its scope.
    pub scope: &'a str,
    /// The working process.
    pub worker: Uuid,
    /// Chunk, loops, retries.
    pub cfg: &'a DrainConfig,
    /// The process's counters (and its stop flag).
    pub stats: &'a Arc<DrainStats>,
}

/// How a worker drains a run: in transactions ([`InTransaction`]) or with
/// leases ([`Leased`]), or either, chosen at run time ([`ByMode`]).
pub trait Drainer: Send + Sync {
    /// The mode's name, for logs.
    fn mode(&self) -> &'static str;

    /// Drains the target's scope until nothing is left, the run stops
    /// running, or its stop flag is set.
    fn drain<'a>(&'a self, target: RunTarget<'a>) -> impl Future<Output = Result<(), EngineError>> + Send + 'a;
}

/// In-transaction mode around a [`ChunkHandler`].
#[derive(Debug)]
pub struct InTransaction<H>(pub Arc<H>);

impl<H: ChunkHandler> Drainer for InTransaction<H> {
    fn mode(&self) -> &'static str {
        "tx"
    }

    async fn drain(&self, t: RunTarget<'_>) -> Result<(), EngineError> {
        drain_in_transactions(t, self.0.clone()).await
    }
}

/// Leased mode around a [`LeasedHandler`].
#[derive(Debug)]
pub struct Leased<H> {
    /// The handler.
    pub handler: Arc<H>,
    /// Lease timings.
    pub leases: LeaseConfig,
}

impl<H: LeasedHandler> Drainer for Leased<H> {
    fn mode(&self) -> &'static str {
        "leased"
    }

    async fn drain(&self, t: RunTarget<'_>) -> Result<(), EngineError> {
        drain_leased(t, self.handler.clone(), self.leases).await
    }
}

/// One of the two modes, chosen at run time (a `--mode` flag).
#[derive(Debug)]
pub enum ByMode<T, L> {
    /// In-transaction mode.
    InTransaction(InTransaction<T>),
    /// Leased mode.
    Leased(Leased<L>),
}

impl<T: ChunkHandler, L: LeasedHandler> Drainer for ByMode<T, L> {
    fn mode(&self) -> &'static str {
        match self {
            ByMode::InTransaction(d) => d.mode(),
            ByMode::Leased(d) => d.mode(),
        }
    }

    async fn drain(&self, target: RunTarget<'_>) -> Result<(), EngineError> {
        match self {
            ByMode::InTransaction(d) => d.drain(target).await,
            ByMode::Leased(d) => d.drain(target).await,
        }
    }
}
