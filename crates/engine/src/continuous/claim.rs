//! Claiming: the head of the eligible index in run order (priority, then
//! `not_before`, then enqueue order), rows nobody else holds
//! (`FOR NO KEY UPDATE SKIP LOCKED`), and nothing while the queue is paused.
//! Each claim returns how long its jobs waited, on the database's clock.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::{ClaimedJob, JobRow, Names, Queue, MAX_BATCH_JOBS};
use crate::common::error::EngineError;
use crate::common::fence::ROW_FENCE;

#[derive(Debug, Clone)]
pub(super) struct Sql {
    in_tx: String,
    keys_in_tx: String,
    leased: String,
}

/// The eligible rows a claim may take, in run order: not before their
/// time, and none while the queue is paused (a one-time filter, read in the
/// claim's own snapshot, so a pause stops the next claim of every worker).
fn runnable(table: &str) -> String {
    format!(
        "FROM {table} t
         WHERE t.status = 'eligible' AND t.not_before <= now()
           AND NOT EXISTS (SELECT 1 FROM settled_engine.queues q
                           WHERE q.name = $2 AND q.paused_at IS NOT NULL)
         ORDER BY t.priority, t.not_before, t.seq"
    )
}

/// The columns a claim returns for each job (the row aliased `t`).
fn job_columns(key: &str, fence: &str) -> String {
    format!(
        "t.{key}::text AS key, {fence} AS fence, t.payload::text AS payload, t.priority, t.traceparent,
         ({fence} & 4294967295)::int - t.attempt_base AS attempt,
         (extract(epoch FROM now() - greatest(t.enqueued_at, t.not_before)) * 1000)::float8 AS waited_ms"
    )
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, key, key_type) = (n.table, n.key, n.key_type);
        let runnable = runnable(table);
        Sql {
            // In-transaction mode: the row locks are the claim, held until
            // the commit that completes the jobs; the fence is the attempt
            // that commit writes.
            in_tx: format!(
                "SELECT {} {runnable}
                 LIMIT $1
                 FOR NO KEY UPDATE OF t SKIP LOCKED",
                job_columns(key, "(t.attempt + 1)::bigint")
            ),
            // Re-locks chosen keys, to run a failed batch's jobs one by one.
            keys_in_tx: format!(
                "SELECT {} FROM {table} t
                 WHERE t.{key} = ANY(CAST($1 AS {key_type}[])) AND t.status = 'eligible'
                 FOR NO KEY UPDATE OF t SKIP LOCKED",
                job_columns(key, "(t.attempt + 1)::bigint")
            ),
            // Leased mode: a short transaction of its own raises the
            // attempt, stamps the primary's timeline and commits the lease.
            // The pick is materialized and joined back on the key, with the
            // status re-checked.
            leased: format!(
                "WITH picked AS MATERIALIZED (
                     SELECT t.{key} AS key {runnable}
                     LIMIT $1
                     FOR NO KEY UPDATE OF t SKIP LOCKED)
                 UPDATE {table} t
                 SET status = 'processing', attempt = t.attempt + 1, lease_owner = $3,
                     lease_until = now() + $4 * interval '1 millisecond', updated_at = now(),
                     fence_epoch = settled_engine.fence_epoch()
                 FROM picked
                 WHERE t.{key} = picked.key AND t.status = 'eligible'
                 RETURNING {}",
                job_columns(key, ROW_FENCE)
            ),
        }
    }
}

fn check_limit(limit: u32) -> Result<(), EngineError> {
    if (1..=MAX_BATCH_JOBS).contains(&limit) {
        Ok(())
    } else {
        Err(EngineError::Config(format!(
            "a claim takes 1..={MAX_BATCH_JOBS} jobs, got {limit}"
        )))
    }
}

async fn fetch_jobs<'q>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, JobRow, sqlx::postgres::PgArguments>,
    conn: &mut PgConnection,
    context: &'static str,
) -> Result<Vec<(ClaimedJob, Duration)>, EngineError> {
    let rows = query.fetch_all(conn).await.map_err(EngineError::db(context))?;
    Ok(rows.into_iter().map(JobRow::into_job).collect())
}

impl Queue {
    /// Locks up to `limit` runnable jobs for the caller's transaction, in
    /// run order, skipping rows other transactions hold. With each job, how
    /// long it waited to be claimed.
    pub async fn claim_in_tx(
        &self,
        tx: &mut PgConnection,
        limit: u32,
    ) -> Result<Vec<(ClaimedJob, Duration)>, EngineError> {
        check_limit(limit)?;
        let query = sqlx::query_as(&self.sql.claim.in_tx)
            .bind(i64::from(limit)) // $1
            .bind(&self.name); // $2
        fetch_jobs(query, tx, "claiming jobs").await
    }

    /// Locks these keys for the caller's transaction if they are still
    /// eligible and nobody holds them.
    pub(crate) async fn lock_keys_in_tx(
        &self,
        tx: &mut PgConnection,
        keys: &[String],
    ) -> Result<Vec<ClaimedJob>, EngineError> {
        let query = sqlx::query_as(&self.sql.claim.keys_in_tx).bind(keys); // $1
        Ok(fetch_jobs(query, tx, "locking jobs")
            .await?
            .into_iter()
            .map(|(job, _)| job)
            .collect())
    }

    /// Claims up to `limit` runnable jobs for `worker` with leases of `ttl`,
    /// committed by this statement (run it outside a transaction).
    pub async fn claim_leased(
        &self,
        conn: &mut PgConnection,
        limit: u32,
        worker: Uuid,
        ttl: Duration,
    ) -> Result<Vec<(ClaimedJob, Duration)>, EngineError> {
        check_limit(limit)?;
        let query = sqlx::query_as(&self.sql.claim.leased)
            .bind(i64::from(limit)) // $1
            .bind(&self.name) // $2
            .bind(worker) // $3
            .bind(ttl.as_millis() as i64); // $4
        fetch_jobs(query, conn, "claiming jobs with leases").await
    }
}
