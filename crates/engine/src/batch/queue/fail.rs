//! Failing: recording a failed attempt of a work table's items, and
//! rescuing its expired leases, with the retry decision of
//! [`retry_set`] (`common/retry.rs`).

use sqlx::PgConnection;

use super::scope::ScopeArg;
use super::{keys_and_fences, Names, WorkQueue};
use crate::common::error::EngineError;
use crate::common::fence::ROW_FENCE;
use crate::common::item::ClaimedItem;
use crate::common::retry::{retry_set, FailOutcome, Failure, RetryPolicy};

#[derive(Debug, Clone)]
pub(super) struct Sql {
    unclaimed: String,
    fenced: String,
    rescue_expired: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type, key, key_type) = (n.table, n.scope, n.scope_type, n.key, n.key_type);
        Sql {
            // In-transaction mode: the failed attempt was never recorded (it
            // rolled back), so count it here. $3 error, $4 permanent,
            // $5 max attempts, $6 base ms, $7 cap ms.
            unclaimed: format!(
                "UPDATE {table} t
                 SET attempt = t.attempt + 1, {}
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{key} = ANY(CAST($2 AS {key_type}[]))
                   AND t.status = 'eligible'
                 RETURNING t.status",
                retry_set("t.attempt + 1", "$3", "$4", ["$5", "$6", "$7"], "NULL")
            ),
            // Leased mode: the claim raised the attempt; the fences ($8) say
            // which claim is failing.
            fenced: format!(
                "UPDATE {table} t
                 SET {}
                 FROM unnest(CAST($2 AS {key_type}[]), CAST($8 AS bigint[])) AS f(key, fence)
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{key} = f.key AND {ROW_FENCE} = f.fence AND t.status = 'processing'
                 RETURNING t.status",
                retry_set("t.attempt", "$3", "$4", ["$5", "$6", "$7"], "NULL")
            ),
            // Expired leases of a scope go back to eligible after a backoff, or
            // fail once their attempts are spent. SKIP LOCKED: a row locked by
            // a completing transaction is left to it.
            rescue_expired: format!(
                "WITH expired AS (
                     SELECT t.{scope} AS scope, t.{key} AS key
                     FROM {table} t
                     WHERE t.{scope} = CAST($1 AS {scope_type})
                       AND t.status = 'processing' AND t.lease_until < now()
                     FOR NO KEY UPDATE OF t SKIP LOCKED)
                 UPDATE {table} t
                 SET {}
                 FROM expired
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{scope} = expired.scope AND t.{key} = expired.key
                   AND t.status = 'processing' AND t.lease_until < now()
                 RETURNING t.status",
                retry_set(
                    "t.attempt",
                    "'lease expired: worker ' || coalesce(t.lease_owner::text, '?') || ' stopped renewing'",
                    "false",
                    ["$2", "$3", "$4"],
                    "NULL",
                )
            ),
        }
    }
}

impl WorkQueue {
    /// In-transaction mode: records a failed attempt on eligible items (after
    /// the attempt's transaction rolled back): retry later, or `failed`.
    pub async fn fail_unclaimed(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[String],
        failure: Failure<'_>,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        let query = bind_failure(
            &self.sql.fail.unclaimed,
            self.scope_arg(scope)?,
            keys.to_vec(),
            failure,
            policy,
        );
        record(query, conn).await
    }

    /// Leased mode: records a failed attempt on items still held with these
    /// fences: retry later, or `failed`.
    pub async fn fail_fenced(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        items: &[ClaimedItem],
        failure: Failure<'_>,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        let (keys, fences) = keys_and_fences(items);
        let query = bind_failure(&self.sql.fail.fenced, self.scope_arg(scope)?, keys, failure, policy).bind(fences); // $8
        record(query, conn).await
    }

    /// Returns the scope's expired leases to `eligible` (after a backoff) or
    /// `failed` (attempts spent). Every leased drain runs it (the rescuer, [`crate::raw::keep_rescuing`]).
    pub async fn rescue_expired(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        let statuses: Vec<String> = sqlx::query_scalar(&self.sql.fail.rescue_expired)
            .bind(self.scope_arg(scope)?) // $1
            .bind(policy.max_attempts) // $2
            .bind(policy.backoff_base_ms as i64) // $3
            .bind(policy.backoff_cap_ms as i64) // $4
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("rescuing expired leases"))?;
        Ok(FailOutcome::count(&statuses))
    }
}

type StatusQuery<'q> = sqlx::query::QueryScalar<'q, sqlx::Postgres, String, sqlx::postgres::PgArguments>;

/// Binds the parameters both failure statements share ($1..$7).
fn bind_failure<'q>(
    sql: &'q str,
    scope: ScopeArg,
    keys: Vec<String>,
    failure: Failure<'q>,
    policy: &RetryPolicy,
) -> StatusQuery<'q> {
    sqlx::query_scalar(sql)
        .bind(scope) // $1
        .bind(keys) // $2
        .bind(failure.error) // $3
        .bind(failure.permanent) // $4
        .bind(policy.max_attempts) // $5
        .bind(policy.backoff_base_ms as i64) // $6
        .bind(policy.backoff_cap_ms as i64) // $7
}

/// Runs a failure statement and counts what it decided.
async fn record(query: StatusQuery<'_>, conn: &mut PgConnection) -> Result<FailOutcome, EngineError> {
    let statuses = query
        .fetch_all(conn)
        .await
        .map_err(EngineError::db("recording a failed attempt"))?;
    Ok(FailOutcome::count(&statuses))
}
