//! Failing: recording a failed attempt, and the one retry decision every
//! failure path shares (in-transaction, leased, the rescuer): a permanent
//! error or the last allowed attempt fails the item; otherwise it waits
//! `base * 2^(attempt-1)` ms, capped, times a jitter in [0.5, 1).

use sqlx::PgConnection;

use super::scope::ScopeArg;
use super::{keys_and_fences, Names, WorkQueue};
use crate::fence::ROW_FENCE;
use crate::{ClaimedItem, EngineError};

/// Default attempts before `failed`.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;

/// When a failed attempt may be retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts before an item goes to `failed` (counted from its
    /// `attempt_base`, which an operator's retry raises).
    pub max_attempts: i32,
    /// First backoff, in milliseconds (doubles per attempt).
    pub backoff_base_ms: u64,
    /// Longest backoff, in milliseconds.
    pub backoff_cap_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 300_000,
        }
    }
}

/// How many items a failure statement sent back to retry, and how many failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailOutcome {
    /// Back to `eligible`, to retry after a backoff.
    pub retried: u64,
    /// Now `failed`.
    pub failed: u64,
}

impl FailOutcome {
    pub(crate) fn count(statuses: &[String]) -> FailOutcome {
        let failed = statuses.iter().filter(|s| *s == "failed").count() as u64;
        FailOutcome {
            retried: statuses.len() as u64 - failed,
            failed,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Sql {
    unclaimed: String,
    fenced: String,
    rescue_expired: String,
}

/// The SET list of the retry decision. Arguments are SQL expressions;
/// `failed_not_before` is what `not_before` becomes when the item fails.
pub(crate) fn retry_set(
    attempt: &str,
    error: &str,
    permanent: &str,
    [max, base, cap]: [&str; 3],
    failed_not_before: &str,
) -> String {
    let gives_up = format!("{permanent} OR {attempt} - t.attempt_base >= {max}");
    format!(
        "status = CASE WHEN {gives_up} THEN 'failed' ELSE 'eligible' END,
         not_before = CASE WHEN {gives_up} THEN {failed_not_before}
             ELSE now() + least({cap}::float8, {base}::float8 * power(2, greatest({attempt} - t.attempt_base - 1, 0)))
                          * (0.5 + random() / 2) * interval '1 millisecond' END,
         last_error = {error}, lease_owner = NULL, lease_until = NULL, updated_at = now()"
    )
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let Names {
            table,
            scope,
            scope_type,
            key,
            key_type,
        } = *n;
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

/// What a failed attempt records.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The error, stored in `last_error`.
    pub error: &'a str,
    /// True when retrying cannot help: the item fails at once.
    pub permanent: bool,
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
