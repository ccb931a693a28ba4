//! The provider's limits for the whole fleet, in the database: a token
//! bucket of calls per second, and a "down until" that every worker
//! honours after the provider failed, raised once per outage (not per
//! caller). Each process takes calls from the bucket a tenth of a second's
//! worth at a time and answers from what it holds.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;

/// The fleet's limits on calls to one provider.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The provider's name in `settlement.provider_limits`.
    pub name: String,
    /// Calls per second, over every worker.
    pub per_second: f64,
    /// Calls that may go at once after a quiet spell.
    pub burst: f64,
    /// First wait after the provider failed, in milliseconds (doubles per
    /// outage window, up to `down_cap_ms`).
    pub down_base_ms: i32,
    /// Longest wait.
    pub down_cap_ms: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            name: "default".into(),
            per_second: 1_000.0,
            burst: 1_000.0,
            down_base_ms: 500,
            down_cap_ms: 30_000,
        }
    }
}

/// This process's share of the fleet's calls: taken from the database's
/// bucket a tenth of a second's worth at a time, so the bucket's row is
/// written a few times a second per process, not once per call. One task
/// at a time takes from the bucket; the others wait for its grant and share
/// it (each taking from the bucket itself queued every call in flight on
/// the bucket's row lock, and each grant replaced the one before).
pub struct Limiter {
    pool: PgPool,
    limits: Limits,
    local: Mutex<Budget>,
    refill: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Budget {
    calls: u32,
    down_until: Option<Instant>,
    /// The bucket was empty: no call before then.
    empty_until: Option<Instant>,
    /// This process saw the provider down: the next success says it is up.
    saw_down: bool,
}

impl Budget {
    /// A call from what this process holds: allowed, a wait, or None (ask
    /// the bucket).
    fn take(&mut self) -> Option<Result<(), Duration>> {
        let now = Instant::now();
        if let Some(until) = self.down_until.filter(|u| *u > now) {
            return Some(Err(until - now));
        }
        if self.calls > 0 {
            self.calls -= 1;
            return Some(Ok(()));
        }
        self.empty_until.filter(|u| *u > now).map(|until| Err(until - now))
    }
}

#[derive(sqlx::FromRow)]
struct Grant {
    granted: i32,
    wait_secs: f64,
    down_secs: Option<f64>,
}

impl Limiter {
    /// A limiter over `limits`, shared by the fleet through `pool`'s database.
    pub fn new(pool: PgPool, limits: Limits) -> Limiter {
        Limiter {
            pool,
            limits,
            local: Mutex::new(Budget::default()),
            refill: tokio::sync::Mutex::new(()),
        }
    }

    /// One call's permission, or how long to wait for it.
    pub(crate) async fn take(&self) -> anyhow::Result<Result<(), Duration>> {
        if let Some(answer) = self.local.lock().expect("budget").take() {
            return Ok(answer);
        }
        let _refilling = self.refill.lock().await;
        // Another task may have refilled while this one waited.
        if let Some(answer) = self.local.lock().expect("budget").take() {
            return Ok(answer);
        }
        let wanted = (self.limits.per_second / 10.0).ceil().max(1.0) as i32;
        let grant: Grant = sqlx::query_as(
            "SELECT granted, wait_secs,
                    extract(epoch FROM g.down_until - clock_timestamp())::float8 AS down_secs
             FROM settlement.take_provider_calls($1, $2, $3, $4) g",
        )
        .bind(&self.limits.name) // $1
        .bind(wanted) // $2
        .bind(self.limits.per_second) // $3
        .bind(self.limits.burst) // $4
        .fetch_one(&self.pool)
        .await?;
        let mut local = self.local.lock().expect("budget");
        local.down_until = grant
            .down_secs
            .filter(|s| *s > 0.0)
            .map(|s| Instant::now() + Duration::from_secs_f64(s));
        if let Some(until) = local.down_until {
            // The calls granted stay in the budget for after the outage.
            local.calls += grant.granted.max(0) as u32;
            return Ok(Err(until - Instant::now()));
        }
        if grant.granted > 0 {
            local.calls += grant.granted as u32 - 1;
            local.empty_until = None;
            return Ok(Ok(()));
        }
        let wait = Duration::from_secs_f64(grant.wait_secs.clamp(0.001, 60.0));
        local.empty_until = Some(Instant::now() + wait);
        Ok(Err(wait))
    }

    /// The provider failed as if down: the fleet waits; returns how long.
    pub(crate) async fn down(&self) -> anyhow::Result<Duration> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM settlement.provider_down($1, $2, $3) - clock_timestamp())::float8",
        )
        .bind(&self.limits.name) // $1
        .bind(self.limits.down_base_ms) // $2
        .bind(self.limits.down_cap_ms) // $3
        .fetch_one(&self.pool)
        .await?;
        let wait = Duration::from_secs_f64(secs.unwrap_or(0.0).max(0.05));
        let mut local = self.local.lock().expect("budget");
        local.down_until = Some(Instant::now() + wait);
        local.saw_down = true;
        Ok(wait)
    }

    /// The provider answered: if this process saw it down, the fleet's wait ends.
    pub(crate) async fn up(&self) -> anyhow::Result<()> {
        let saw_down = std::mem::take(&mut self.local.lock().expect("budget").saw_down);
        if saw_down {
            sqlx::query("SELECT settlement.provider_up($1)")
                .bind(&self.limits.name) // $1
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_answers_from_what_it_holds_and_asks_the_bucket_only_when_it_has_nothing() {
        let mut budget = Budget {
            calls: 2,
            ..Budget::default()
        };
        assert_eq!(budget.take(), Some(Ok(())));
        assert_eq!(budget.take(), Some(Ok(())));
        assert_eq!(budget.take(), None, "empty: ask the bucket");
        budget.empty_until = Some(Instant::now() + Duration::from_secs(5));
        assert!(
            matches!(budget.take(), Some(Err(wait)) if wait > Duration::from_secs(4)),
            "the bucket was empty: wait, without asking it again"
        );
        budget.calls = 3;
        budget.down_until = Some(Instant::now() + Duration::from_secs(9));
        assert!(
            matches!(budget.take(), Some(Err(wait)) if wait > Duration::from_secs(8)),
            "the provider is down: wait, keeping the calls"
        );
        assert_eq!(budget.calls, 3);
    }
}
