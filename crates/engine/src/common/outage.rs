//! The outage clock: since when the database has been away, as every loop
//! of one process sees it. It starts at the first failure any loop sees
//! (or when a wait for a connection that then failed began) and stops at
//! the first success. A loop gives up once the outage has lasted longer
//! than its limit, and no wait for a pooled connection outlasts that
//! moment. It never retries anything itself.

use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::watch;

use crate::common::error::{is_transient_sqlx, EngineError};

/// Since when the database has been away (None: it answers). A clone is
/// the same clock.
#[derive(Debug, Clone)]
pub struct OutageClock {
    since: std::sync::Arc<watch::Sender<Option<Instant>>>,
}

impl Default for OutageClock {
    fn default() -> Self {
        OutageClock {
            since: std::sync::Arc::new(watch::channel(None).0),
        }
    }
}

impl OutageClock {
    /// Since when the database has been away, if it is.
    pub fn since(&self) -> Option<Instant> {
        *self.since.borrow()
    }

    /// A failure that began at `at` (a wait for a connection fails at its
    /// end, but the database was away from its start). Returns since when
    /// the database has been away.
    pub(crate) fn failed(&self, at: Instant) -> Instant {
        self.since.send_if_modified(|since| match since {
            Some(earlier) if *earlier <= at => false,
            _ => {
                *since = Some(at);
                true
            }
        });
        self.since().unwrap_or(at)
    }

    /// The database answered: the outage, if any, is over.
    pub(crate) fn recovered(&self) {
        if self.since().is_some() {
            self.since.send_if_modified(|since| since.take().is_some());
        }
    }

    /// True once the outage has lasted longer than `limit`.
    pub fn outlasted(&self, limit: Duration) -> bool {
        self.since().is_some_and(|since| since.elapsed() > limit)
    }

    /// Returns once an outage has lasted longer than `limit` (at once if one has).
    pub(crate) async fn until_outlasted(&self, limit: Duration) {
        let mut changes = self.since.subscribe();
        loop {
            let since = *changes.borrow_and_update();
            let Some(since) = since else {
                // The sender lives as long as `self`: changed() fails never.
                let _ = changes.changed().await;
                continue;
            };
            tokio::select! {
                _ = tokio::time::sleep_until((since + limit).into()) => return,
                _ = changes.changed() => {}
            }
        }
    }

    /// A pooled connection, waited for no longer than `limit` allows: at
    /// most `limit` (the pool's own timeout may end it sooner), and never
    /// past the moment the outage has lasted `limit`. A wait that fails
    /// counts as an outage from its start.
    pub async fn acquire(&self, pool: &PgPool, limit: Duration) -> Result<PoolConnection<Postgres>, EngineError> {
        let started = Instant::now();
        let acquired = tokio::select! {
            acquired = pool.acquire() => acquired,
            _ = tokio::time::sleep(limit) => Err(sqlx::Error::PoolTimedOut),
            _ = self.until_outlasted(limit) => Err(sqlx::Error::PoolTimedOut),
        };
        if let Err(err) = &acquired {
            if is_transient_sqlx(err) {
                self.failed(started);
            }
        }
        acquired.map_err(EngineError::db("acquiring a connection"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_runs_from_the_earliest_failure_until_a_success() {
        let clock = OutageClock::default();
        assert_eq!(clock.since(), None);
        let first = Instant::now();
        let later = first + Duration::from_millis(5);
        assert_eq!(clock.failed(later), later);
        assert_eq!(clock.failed(first), first, "an earlier start moves the clock back");
        assert_eq!(clock.failed(later), first, "a later failure does not move it");
        clock.recovered();
        assert_eq!(clock.since(), None);
    }

    #[tokio::test]
    async fn until_outlasted_waits_for_an_outage_and_its_limit() {
        let clock = std::sync::Arc::new(OutageClock::default());
        let limit = Duration::from_millis(300);
        let waiting = tokio::spawn({
            let clock = clock.clone();
            async move { clock.until_outlasted(limit).await }
        });
        tokio::time::sleep(limit * 2).await;
        assert!(!waiting.is_finished(), "no outage: nothing to wait for");
        let began = Instant::now();
        clock.failed(began);
        waiting.await.unwrap();
        assert!(began.elapsed() >= limit, "returned before the limit");
        assert!(clock.outlasted(limit));
    }
}
