//! A drain's configuration ([`DrainConfig`]) and its counters
//! ([`DrainStats`]), shared by a worker's drains, its rescuer, its heartbeat
//! and its daemon.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::common::outage::OutageClock;
use crate::common::retry::RetryPolicy;

/// How to drain a run.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    /// Items per claim (1..=[`MAX_CHUNK_ITEMS`](crate::batch::queue::MAX_CHUNK_ITEMS)).
    pub chunk: u32,
    /// Claim loops in this process (1..=[`MAX_CONCURRENCY`](crate::common::backoff::MAX_CONCURRENCY)).
    pub concurrency: u32,
    /// Pause when nothing is claimable but work remains (others hold it).
    pub idle_poll: Duration,
    /// Consecutive non-transient failures of one loop before it gives up.
    pub max_consecutive_failures: u32,
    /// Attempts and backoff of failed items.
    pub retry: RetryPolicy,
    /// How long a loop keeps retrying while the database is away (lost
    /// connections, a restart, a failover) before it gives up with
    /// [`EngineError::Unavailable`](crate::common::error::EngineError::Unavailable).
    pub max_outage: Duration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            chunk: 100,
            concurrency: 4,
            idle_poll: Duration::from_millis(50),
            max_consecutive_failures: 10,
            retry: RetryPolicy::default(),
            max_outage: Duration::from_secs(900),
        }
    }
}

/// Counters a drain updates as it goes (shared with progress displays).
#[derive(Debug, Default)]
pub struct DrainStats {
    /// Items this process settled.
    pub items_settled: AtomicU64,
    /// Items this process marked held (the application refused them for now).
    pub items_held: AtomicU64,
    /// Items that went to `failed` from this process.
    pub items_failed: AtomicU64,
    /// Failed attempts sent back to retry later.
    pub items_retried: AtomicU64,
    /// Chunks this process committed.
    pub chunks_committed: AtomicU64,
    /// Chunks rolled back after an error.
    pub chunks_rolled_back: AtomicU64,
    /// Chunks split in halves to isolate a failing item.
    pub chunks_split: AtomicU64,
    /// Completions refused because the item's lease (fence) was lost.
    pub fence_rejections: AtomicU64,
    /// Expired leases this process's rescuer sent back (or failed).
    pub leases_rescued: AtomicU64,
    /// Leases given back at shutdown.
    pub leases_released: AtomicU64,
    /// Claim statements run.
    pub claims: AtomicU64,
    /// Items claimed (an item retried is claimed again).
    pub items_claimed: AtomicU64,
    /// Total time spent in claim statements, in microseconds.
    pub claim_micros: AtomicU64,
    /// Set to stop claiming new chunks (the current ones finish).
    pub stop: AtomicBool,
    /// Since when the database has been away, as this process's loops see it.
    pub outage: OutageClock,
}

impl DrainStats {
    /// Counts one claim statement and records its time (in the claim
    /// histogram, labelled with the mode, and in `claim_micros`).
    pub(crate) fn record_claim(&self, mode: &'static str, elapsed: Duration) {
        self.claims.fetch_add(1, Ordering::Relaxed);
        metrics::histogram!(crate::common::telemetry::CLAIM_DURATION, "mode" => mode).record(elapsed.as_secs_f64());
        self.claim_micros
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }
}
