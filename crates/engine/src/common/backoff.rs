//! The backoff of a claim loop, batch or continuous: failures in a row, the
//! process's outage, and the pause before the next step. It decides; the
//! loops sleep and log.

use std::time::{Duration, Instant};

use crate::common::error::EngineError;
use crate::common::outage::OutageClock;

/// Largest number of claim loops one process may run.
pub const MAX_CONCURRENCY: u32 = 256;
/// Longest pause between two retries after failures.
pub const MAX_RETRY_BACKOFF_MS: u64 = 2_000;

/// A loop's failures in a row and the outage it may be in: after each
/// step, whether to go on, how long to back off, or that the loop must
/// give up. Transient failures (the database restarting, a terminated
/// connection, a failover) are retried until the outage, on the process's
/// [`OutageClock`] (from the first failure any of its loops saw), lasts
/// longer than allowed; others give up after a number in a row.
#[derive(Debug)]
pub(crate) struct Backoff<'c> {
    failures: u32,
    transient_streak: u32,
    outage: &'c OutageClock,
    max_failures: u32,
    max_outage: Duration,
}

/// What a loop does after a failed step it may retry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pause {
    /// How long to sleep before the next step.
    pub(crate) sleep: Duration,
    /// Whether to log the failure (a transient streak is said once, at its
    /// start).
    pub(crate) say: bool,
}

impl Backoff<'_> {
    pub(crate) fn new(max_failures: u32, max_outage: Duration, outage: &OutageClock) -> Backoff<'_> {
        Backoff {
            failures: 0,
            transient_streak: 0,
            outage,
            max_failures,
            max_outage,
        }
    }

    /// A step succeeded (`worked`: it did work, which ends a run of
    /// failures). Returns the length of the transient streak it ends.
    pub(crate) fn succeeded(&mut self, worked: bool) -> Option<u32> {
        self.outage.recovered();
        if worked {
            self.failures = 0;
        }
        let streak = std::mem::take(&mut self.transient_streak);
        (streak > 0).then_some(streak)
    }

    /// A step failed with `err`: the pause before the next step and
    /// whether to say so, or the error that ends the loop.
    pub(crate) fn failed(&mut self, err: &EngineError) -> Result<Pause, EngineError> {
        let transient = err.is_transient();
        let mut longest = Duration::from_millis(MAX_RETRY_BACKOFF_MS);
        if transient {
            self.transient_streak += 1;
            let since = self.outage.failed(Instant::now());
            if since.elapsed() > self.max_outage {
                return Err(EngineError::Unavailable {
                    secs: since.elapsed().as_secs(),
                    last: err.to_string(),
                });
            }
            // Never past the limit: the next step then gives up at once.
            longest = longest.min(self.max_outage.saturating_sub(since.elapsed()) + Duration::from_millis(10));
        } else {
            self.failures += 1;
            if self.failures >= self.max_failures {
                return Err(EngineError::TooManyFailures {
                    attempts: self.failures,
                    last: err.to_string(),
                });
            }
        }
        let exponent = (self.failures + self.transient_streak).min(10);
        Ok(Pause {
            sleep: Duration::from_millis(25u64 << exponent).min(longest),
            say: !transient || self.transient_streak == 1,
        })
    }

    /// Failures in a row that were not transient.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}
