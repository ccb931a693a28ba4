//! Leases, as both kinds of queue hold them: their timings ([`LeaseConfig`]
//! and its limits), and the lease keeper: which leases this worker holds,
//! until when each is known to be valid, and their renewal in one statement
//! every ttl/3. Where a renewal goes is the queue's ([`LeaseStore`]); this
//! module never names a table.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::common::error::EngineError;
use crate::common::item::ClaimedItem;
use crate::common::outage::OutageClock;

/// Shortest lease allowed.
pub const MIN_LEASE_TTL_MS: u64 = 300;
/// Longest lease allowed.
pub const MAX_LEASE_TTL_MS: u64 = 3_600_000;
/// Times a completion is retried after a transient error while the leases hold.
pub const COMPLETION_RETRIES: u32 = 5;

/// Lease timings.
#[derive(Debug, Clone, Copy)]
pub struct LeaseConfig {
    /// How long a lease lasts without renewal (database clock).
    pub ttl: Duration,
    /// How often this worker's rescuer looks for expired leases.
    pub rescue_interval: Duration,
    /// After a stop request, how long in-flight work may continue before
    /// the rest is released.
    pub shutdown_grace: Duration,
    /// Items worked at once by this process, over all its claim loops
    /// (1..=[`MAX_CALLS_IN_FLIGHT`]): a chunk's calls run concurrently, up to
    /// this many, each started only while its lease is known to be held.
    pub calls_in_flight: usize,
}

/// Most items a process works at once in leased mode.
pub const MAX_CALLS_IN_FLIGHT: usize = 1024;
/// Default of [`LeaseConfig::calls_in_flight`].
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 128;

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            ttl: Duration::from_secs(30),
            rescue_interval: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            calls_in_flight: DEFAULT_CALLS_IN_FLIGHT,
        }
    }
}

/// Checks a lease config's ranges.
pub(crate) fn check_lease_config(leases: &LeaseConfig) -> Result<(), EngineError> {
    let ttl_ms = leases.ttl.as_millis() as u64;
    if !(MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(&ttl_ms) {
        return Err(EngineError::Config(format!(
            "lease ttl must be {MIN_LEASE_TTL_MS}..={MAX_LEASE_TTL_MS} ms, got {ttl_ms}"
        )));
    }
    if !(1..=MAX_CALLS_IN_FLIGHT).contains(&leases.calls_in_flight) {
        return Err(EngineError::Config(format!(
            "calls in flight must be 1..={MAX_CALLS_IN_FLIGHT}, got {}",
            leases.calls_in_flight
        )));
    }
    Ok(())
}

/// Where leases are renewed: a scope of a batch queue, or a continuous queue.
pub(crate) trait LeaseStore: Send + Sync + 'static {
    /// Extends the leases `worker` holds on `held` to `now() + ttl`, in one
    /// statement; returns those it still holds.
    fn renew<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        worker: Uuid,
        ttl: Duration,
        held: &'a [ClaimedItem],
    ) -> impl Future<Output = Result<Vec<ClaimedItem>, EngineError>> + Send + 'a;
}

/// The leases one worker holds, and until when each is known to be valid
/// on this process's monotonic clock (time the renewal was *sent* + ttl:
/// the database set `now() + ttl` no earlier than that).
///
/// A renewal and a loop writing its items' outcome (completion, failure,
/// hold, release) never lock the same rows at once: each updates many rows
/// in its own order, so together they could each hold a row the other
/// waits for (measured: deadlocks at a million in leased mode). A writer
/// waits out a renewal in flight, then marks its items; renewals leave
/// marked items alone until the writer is done (`LeaseKeeper::writing`).
#[derive(Debug)]
pub struct LeaseKeeper {
    worker: Uuid,
    ttl: Duration,
    held: Mutex<HashMap<ClaimedItem, Held>>,
    /// Held by a renewal for the whole of its statement.
    pub(crate) renewing: tokio::sync::Mutex<()>,
    /// The process's outage clock and its limit: a renewal (and the loops
    /// waiting for it to finish) never waits for a connection past it.
    outage: OutageClock,
    outage_limit: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    /// When the claim had committed (its statement returned).
    committed_by: Instant,
    /// Until when the lease is known to be valid.
    valid_until: Instant,
    /// A loop is writing the item's outcome: renewals skip it.
    writing: bool,
}

/// Items a loop is writing the outcome of; renewals skip them until this
/// is dropped.
#[must_use = "renewals skip the items only while this is alive"]
pub(crate) struct Writing<'k> {
    keeper: &'k LeaseKeeper,
    items: Vec<ClaimedItem>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut held = self.keeper.held.lock().expect("lease map");
        for item in &self.items {
            if let Some(lease) = held.get_mut(item) {
                lease.writing = false;
            }
        }
    }
}

impl LeaseKeeper {
    /// A keeper for `worker`'s leases (a renewal waits for a connection at
    /// most `ttl`: the leases are gone by then).
    pub fn new(worker: Uuid, ttl: Duration) -> Arc<LeaseKeeper> {
        LeaseKeeper::on_clock(worker, ttl, OutageClock::default(), ttl)
    }

    /// A keeper whose renewals wait for a connection no longer than the
    /// process's outage clock allows (`limit`), nor longer than `ttl`.
    pub fn on_clock(worker: Uuid, ttl: Duration, outage: OutageClock, limit: Duration) -> Arc<LeaseKeeper> {
        Arc::new(LeaseKeeper {
            worker,
            ttl,
            held: Mutex::new(HashMap::new()),
            renewing: tokio::sync::Mutex::new(()),
            outage,
            outage_limit: limit.min(ttl),
        })
    }

    /// Marks `items` as being written by the caller: waits for a renewal in
    /// flight to finish (it may hold their rows), and keeps later renewals
    /// off them until the returned guard is dropped.
    pub(crate) async fn writing(&self, items: &[ClaimedItem]) -> Writing<'_> {
        let _no_renewal = self.renewing.lock().await;
        let mut held = self.held.lock().expect("lease map");
        for item in items {
            if let Some(lease) = held.get_mut(item) {
                lease.writing = true;
            }
        }
        Writing {
            keeper: self,
            items: items.to_vec(),
        }
    }

    pub(crate) fn add(&self, items: &[ClaimedItem], claim_sent: Instant, committed_by: Instant) {
        let mut held = self.held.lock().expect("lease map");
        for item in items {
            let lease = Held {
                committed_by,
                valid_until: claim_sent + self.ttl,
                writing: false,
            };
            held.insert(item.clone(), lease);
        }
    }

    pub(crate) fn remove(&self, items: &[ClaimedItem]) {
        let mut held = self.held.lock().expect("lease map");
        for item in items {
            held.remove(item);
        }
    }

    /// True while the item's lease is known to be valid.
    pub fn is_held(&self, item: &ClaimedItem) -> bool {
        let held = self.held.lock().expect("lease map");
        held.get(item).is_some_and(|lease| Instant::now() < lease.valid_until)
    }

    /// Number of leases currently tracked.
    pub fn len(&self) -> usize {
        self.held.lock().expect("lease map").len()
    }

    /// True when no lease is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Renews every lease this worker knows it holds (one statement), then extends
    /// the deadlines of those the database still shows as ours and drops
    /// the others (rescued: lost). Items a loop is writing are left alone.
    pub(crate) async fn renew(&self, pool: &PgPool, store: &impl LeaseStore) -> Result<usize, EngineError> {
        let _renewing = self.renewing.lock().await;
        let asked: Vec<ClaimedItem> = self
            .held
            .lock()
            .expect("lease map")
            .iter()
            .filter(|(_, lease)| !lease.writing)
            .map(|(item, _)| item.clone())
            .collect();
        if asked.is_empty() {
            return Ok(0);
        }
        let sent = Instant::now();
        let mut conn = self.outage.acquire(pool, self.outage_limit).await?;
        let still_ours = store.renew(&mut conn, self.worker, self.ttl, &asked).await?;
        let still_ours: std::collections::HashSet<ClaimedItem> = still_ours.into_iter().collect();
        let asked: std::collections::HashSet<ClaimedItem> = asked.into_iter().collect();
        let mut held = self.held.lock().expect("lease map");
        let mut lost = 0;
        // Only the leases this statement asked about: not those being
        // written, nor those claimed since.
        for (key, lease) in held.iter_mut().filter(|(key, _)| asked.contains(*key)) {
            if still_ours.contains(key) {
                lease.valid_until = lease.valid_until.max(sent + self.ttl);
            } else if lease.committed_by < sent && lease.valid_until > sent {
                // Committed before this statement started, yet not ours:
                // rescued. Stop working on it (its completion would be refused).
                lease.valid_until = sent;
                lost += 1;
            }
        }
        Ok(lost)
    }

    /// Runs [`renew`](Self::renew) every ttl/3 until the task is dropped.
    pub(crate) async fn keep_renewing(self: Arc<Self>, pool: PgPool, store: impl LeaseStore) {
        let mut tick = tokio::time::interval(self.ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.renew(&pool, &store).await {
                Ok(0) => {}
                Ok(lost) => {
                    tracing::warn!(worker = %self.worker, lost, "leases lost: abandoning those items")
                }
                Err(err) => {
                    tracing::warn!(worker = %self.worker, error = %err, "lease renewal failed")
                }
            }
        }
    }
}
