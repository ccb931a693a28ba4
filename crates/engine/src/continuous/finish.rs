//! Finishing a claim: completing jobs (in the claiming transaction, or
//! fenced after a lease), recording a failed attempt (retry after a backoff,
//! or `failed` once the attempts are spent: a dead letter, with its attempt
//! history), and snoozing (back later without spending an attempt).

use std::time::Duration;

use sqlx::PgConnection;

use super::{keys_and_fences, ClaimedJob, Names, Queue, MAX_ERRORS_KEPT};
use crate::common::error::EngineError;
use crate::common::fence::ROW_FENCE;
use crate::common::retry::{retry_set, FailOutcome, Failure, RetryPolicy};

#[derive(Debug, Clone)]
pub(super) struct Sql {
    complete_in_tx: String,
    complete_fenced: String,
    fail_unclaimed: String,
    fail_fenced: String,
    snooze_unclaimed: String,
    snooze_fenced: String,
}

/// The attempt history with one more entry (`attempt`, `error` are SQL
/// expressions), keeping the last [`MAX_ERRORS_KEPT`].
pub(super) fn errors_appended(attempt: &str, error: &str) -> String {
    format!(
        "errors = CASE WHEN jsonb_array_length(t.errors) >= {MAX_ERRORS_KEPT} THEN t.errors - 0 ELSE t.errors END
                  || jsonb_build_array(jsonb_build_object('attempt', {attempt} - t.attempt_base,
                                                         'at', now(), 'error', {error}))"
    )
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, key, key_type) = (n.table, n.key, n.key_type);
        // The claim in the caller's transaction (rolled back since) is
        // still the row's latest: nobody claimed it since.
        let unclaimed = format!(
            "FROM unnest(CAST($1 AS {key_type}[]), CAST($2 AS bigint[])) AS f(key, fence)
             WHERE t.{key} = f.key AND t.attempt + 1 = f.fence AND t.status = 'eligible'"
        );
        let fenced = format!(
            "FROM unnest(CAST($1 AS {key_type}[]), CAST($2 AS bigint[])) AS f(key, fence)
             WHERE t.{key} = f.key AND {ROW_FENCE} = f.fence AND t.status = 'processing'"
        );
        // $3 error, $4 permanent, $5 max attempts, $6 base ms, $7 cap ms.
        let retry = |attempt: &str| {
            format!(
                "{}, {}",
                retry_set(attempt, "$3", "$4", ["$5", "$6", "$7"], "t.not_before"),
                errors_appended(attempt, "$3")
            )
        };
        Sql {
            // The claim's row locks are still held: exactly the claimed rows
            // must change, which the caller checks.
            complete_in_tx: format!(
                "UPDATE {table} t
                 SET status = 'settled', attempt = t.attempt + 1, updated_at = now()
                 WHERE t.{key} = ANY(CAST($1 AS {key_type}[])) AND t.status = 'eligible'"
            ),
            complete_fenced: format!(
                "UPDATE {table} t
                 SET status = 'settled', lease_owner = NULL, lease_until = NULL, updated_at = now()
                 {fenced}
                 RETURNING t.{key}::text"
            ),
            // The attempt rolled back with its transaction: count it here.
            fail_unclaimed: format!(
                "UPDATE {table} t
                 SET attempt = t.attempt + 1, {}
                 {unclaimed}
                 RETURNING t.status",
                retry("t.attempt + 1")
            ),
            fail_fenced: format!(
                "UPDATE {table} t
                 SET {}
                 {fenced}
                 RETURNING t.status",
                retry("t.attempt")
            ),
            // $3 delay ms, $4 why. Not counted toward the attempts.
            snooze_unclaimed: format!(
                "UPDATE {table} t
                 SET not_before = now() + $3 * interval '1 millisecond', last_error = $4, updated_at = now()
                 {unclaimed}"
            ),
            snooze_fenced: format!(
                "UPDATE {table} t
                 SET status = 'eligible', attempt_base = t.attempt_base + 1,
                     not_before = now() + $3 * interval '1 millisecond', last_error = $4,
                     lease_owner = NULL, lease_until = NULL, updated_at = now()
                 {fenced}"
            ),
        }
    }
}

/// How a claim is held: by the caller's transaction (rolled back before
/// the failure is recorded), or by a lease with its fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// In-transaction mode.
    Unclaimed,
    /// Leased mode.
    Fenced,
}

impl Queue {
    /// Marks the jobs `tx` claimed and handled as settled, in the claiming
    /// transaction; refuses (the caller rolls back) unless every one changed.
    pub async fn complete_in_tx(&self, tx: &mut PgConnection, jobs: &[ClaimedJob]) -> Result<(), EngineError> {
        let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
        let changed = sqlx::query(&self.sql.finish.complete_in_tx)
            .bind(keys) // $1
            .execute(tx)
            .await
            .map_err(EngineError::db("completing jobs"))?
            .rows_affected();
        if changed != jobs.len() as u64 {
            return Err(EngineError::Invariant(format!(
                "completing {} claimed jobs of queue {} changed {changed} rows",
                jobs.len(),
                self.name
            )));
        }
        Ok(())
    }

    /// Settles the jobs whose lease still carries these fences; returns the
    /// keys it settled (the others were lost to a rescue or another claim).
    pub async fn complete_fenced(
        &self,
        tx: &mut PgConnection,
        jobs: &[ClaimedJob],
    ) -> Result<Vec<String>, EngineError> {
        let (keys, fences) = keys_and_fences(jobs);
        sqlx::query_scalar(&self.sql.finish.complete_fenced)
            .bind(keys) // $1
            .bind(fences) // $2
            .fetch_all(tx)
            .await
            .map_err(EngineError::db("completing fenced jobs"))
    }

    /// Records a failed attempt of `jobs`: retried after a backoff, or
    /// `failed` when permanent or out of attempts.
    pub(crate) async fn fail(
        &self,
        conn: &mut PgConnection,
        held: Held,
        jobs: &[ClaimedJob],
        failure: Failure<'_>,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        let (keys, fences) = keys_and_fences(jobs);
        let sql = match held {
            Held::Unclaimed => &self.sql.finish.fail_unclaimed,
            Held::Fenced => &self.sql.finish.fail_fenced,
        };
        let statuses: Vec<String> = sqlx::query_scalar(sql)
            .bind(keys) // $1
            .bind(fences) // $2
            .bind(failure.error) // $3
            .bind(failure.permanent) // $4
            .bind(policy.max_attempts) // $5
            .bind(policy.backoff_base_ms as i64) // $6
            .bind(policy.backoff_cap_ms as i64) // $7
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("recording a failed attempt"))?;
        Ok(FailOutcome::count(&statuses))
    }

    /// Puts `jobs` back for `delay` without spending an attempt; returns how
    /// many it changed.
    pub(crate) async fn snooze(
        &self,
        conn: &mut PgConnection,
        held: Held,
        jobs: &[ClaimedJob],
        delay: Duration,
        why: &str,
    ) -> Result<u64, EngineError> {
        let (keys, fences) = keys_and_fences(jobs);
        let sql = match held {
            Held::Unclaimed => &self.sql.finish.snooze_unclaimed,
            Held::Fenced => &self.sql.finish.snooze_fenced,
        };
        Ok(sqlx::query(sql)
            .bind(keys) // $1
            .bind(fences) // $2
            .bind(delay.as_millis() as i64) // $3
            .bind(why) // $4
            .execute(conn)
            .await
            .map_err(EngineError::db("snoozing jobs"))?
            .rows_affected())
    }
}
