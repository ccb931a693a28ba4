//! Named leases with fencing tokens: acquire a name for a TTL on the
//! database clock and get a fence that grows with every acquisition. A
//! holder that lost the lease (it expired and someone else acquired it) can
//! neither renew nor release it, and any write it guards with its fence is
//! refused.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), settled_engine::EngineError> {
//! use std::time::Duration;
//! use settled_engine::once::named_lease::Lease;
//!
//! if let Some(lease) = Lease::acquire(&pool, "nightly-export", "host-a:1234", Duration::from_secs(30)).await? {
//!     // ... work, renewing before the TTL passes ...
//!     assert!(lease.renew(&pool, Duration::from_secs(30)).await?);
//!     // Writes guarded by the lease carry `lease.fence` and check it.
//!     lease.release(&pool).await?;
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::PgPool;

use crate::common::error::EngineError;

/// A held lease.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Lease {
    /// The lease's name.
    pub name: String,
    /// Who holds it (free text: host and pid, say).
    pub holder: String,
    /// The fencing token: greater than every earlier holder's.
    pub fence: i64,
}

impl Lease {
    /// Acquires `name` for `ttl` if it is free or expired. None while someone
    /// else holds it.
    pub async fn acquire(pool: &PgPool, name: &str, holder: &str, ttl: Duration) -> Result<Option<Lease>, EngineError> {
        let fence: Option<i64> = sqlx::query_scalar(
            "INSERT INTO settled_engine.leases AS l (name, holder, fence, expires_at)
             VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond')
             ON CONFLICT (name) DO UPDATE
             SET holder = EXCLUDED.holder, fence = l.fence + 1,
                 acquired_at = now(), expires_at = EXCLUDED.expires_at
             WHERE l.expires_at <= now()
             RETURNING fence",
        )
        .bind(name)
        .bind(holder)
        .bind(ttl.as_millis() as i64)
        .fetch_optional(pool)
        .await
        .map_err(EngineError::db("acquiring a lease"))?;
        Ok(fence.map(|fence| Lease {
            name: name.to_string(),
            holder: holder.to_string(),
            fence,
        }))
    }

    /// Extends the lease to `now() + ttl`. False when it was lost (expired,
    /// or acquired by someone else since).
    pub async fn renew(&self, pool: &PgPool, ttl: Duration) -> Result<bool, EngineError> {
        let done = sqlx::query(
            "UPDATE settled_engine.leases SET expires_at = now() + $3 * interval '1 millisecond'
             WHERE name = $1 AND fence = $2 AND expires_at > now()",
        )
        .bind(&self.name)
        .bind(self.fence)
        .bind(ttl.as_millis() as i64)
        .execute(pool)
        .await
        .map_err(EngineError::db("renewing a lease"))?
        .rows_affected();
        Ok(done == 1)
    }

    /// Releases the lease now. False when it was no longer ours.
    pub async fn release(&self, pool: &PgPool) -> Result<bool, EngineError> {
        release_fenced(pool, &self.name, self.fence).await
    }
}

/// Releases `name` if `fence` still holds it (the form for a process that
/// only kept the fence). The row stays, so fences keep growing.
pub async fn release_fenced(pool: &PgPool, name: &str, fence: i64) -> Result<bool, EngineError> {
    let done = sqlx::query(
        "UPDATE settled_engine.leases SET expires_at = now()
         WHERE name = $1 AND fence = $2 AND expires_at > now()",
    )
    .bind(name)
    .bind(fence)
    .execute(pool)
    .await
    .map_err(EngineError::db("releasing a lease"))?
    .rows_affected();
    Ok(done == 1)
}
