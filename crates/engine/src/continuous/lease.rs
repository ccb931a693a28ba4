//! Leases on continuous jobs: renewing what a worker holds, giving leases
//! back at shutdown (attempt kept, so the fence still refuses the old
//! holder), and rescuing expired ones (retry after a backoff, or `failed`).

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::finish::errors_appended;
use super::{Names, Queue};
use crate::common::error::EngineError;
use crate::common::fence::{Fence, ROW_FENCE};
use crate::common::item::ClaimedItem;
use crate::common::lease::LeaseStore;
use crate::common::retry::{retry_set, FailOutcome, RetryPolicy};

#[derive(Debug, Clone)]
pub(super) struct Sql {
    renew: String,
    release_own: String,
    rescue_expired: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, key, key_type) = (n.table, n.key, n.key_type);
        let expired_error = "'lease expired: worker ' || coalesce(t.lease_owner::text, '?') || ' stopped renewing'";
        Sql {
            renew: format!(
                "UPDATE {table} t
                 SET lease_until = now() + $2 * interval '1 millisecond'
                 FROM unnest(CAST($3 AS {key_type}[]), CAST($4 AS bigint[])) AS f(key, fence)
                 WHERE t.{key} = f.key AND {ROW_FENCE} = f.fence
                   AND t.status = 'processing' AND t.lease_owner = $1
                 RETURNING t.{key}::text AS key, {ROW_FENCE} AS fence"
            ),
            release_own: format!(
                "UPDATE {table}
                 SET status = 'eligible', lease_owner = NULL, lease_until = NULL, updated_at = now()
                 WHERE status = 'processing' AND lease_owner = $1
                   AND ($2::text[] IS NULL OR {key}::text = ANY($2::text[]))"
            ),
            // SKIP LOCKED: a row locked by a completing transaction is left to it.
            rescue_expired: format!(
                "WITH expired AS MATERIALIZED (
                     SELECT t.{key} AS key FROM {table} t
                     WHERE t.status = 'processing' AND t.lease_until < now()
                     LIMIT $4
                     FOR NO KEY UPDATE OF t SKIP LOCKED)
                 UPDATE {table} t
                 SET {}, {}
                 FROM expired
                 WHERE t.{key} = expired.key AND t.status = 'processing' AND t.lease_until < now()
                 RETURNING t.status",
                retry_set("t.attempt", expired_error, "false", ["$1", "$2", "$3"], "t.not_before"),
                errors_appended("t.attempt", expired_error)
            ),
        }
    }
}

/// Most expired leases one rescue statement takes.
pub const RESCUE_BATCH_JOBS: i64 = 1_000;

impl Queue {
    /// Gives back leases `worker` holds (all, or only `keys`): eligible at
    /// once, attempt kept.
    pub async fn release_leases(
        &self,
        conn: &mut PgConnection,
        worker: Uuid,
        keys: Option<&[String]>,
    ) -> Result<u64, EngineError> {
        Ok(sqlx::query(&self.sql.lease.release_own)
            .bind(worker) // $1
            .bind(keys) // $2
            .execute(conn)
            .await
            .map_err(EngineError::db("releasing leases"))?
            .rows_affected())
    }

    /// Sends up to [`crate::continuous::lease::RESCUE_BATCH_JOBS`] expired leases back (after a
    /// backoff) or to `failed` (attempts spent).
    pub async fn rescue_expired(
        &self,
        conn: &mut PgConnection,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        let statuses: Vec<String> = sqlx::query_scalar(&self.sql.lease.rescue_expired)
            .bind(policy.max_attempts) // $1
            .bind(policy.backoff_base_ms as i64) // $2
            .bind(policy.backoff_cap_ms as i64) // $3
            .bind(RESCUE_BATCH_JOBS) // $4
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("rescuing expired leases"))?;
        Ok(FailOutcome::count(&statuses))
    }
}

impl LeaseStore for Queue {
    async fn renew(
        &self,
        conn: &mut PgConnection,
        worker: Uuid,
        ttl: Duration,
        held: &[ClaimedItem],
    ) -> Result<Vec<ClaimedItem>, EngineError> {
        {
            let (keys, fences): (Vec<String>, Vec<i64>) =
                held.iter().map(|i| (i.key.clone(), i.fence.packed())).unzip();
            let rows: Vec<(String, Fence)> = sqlx::query_as(&self.sql.lease.renew)
                .bind(worker) // $1
                .bind(ttl.as_millis() as i64) // $2
                .bind(keys) // $3
                .bind(fences) // $4
                .fetch_all(conn)
                .await
                .map_err(EngineError::db("renewing leases"))?;
            Ok(rows
                .into_iter()
                .map(|(key, fence)| ClaimedItem { key, fence })
                .collect())
        }
    }
}
