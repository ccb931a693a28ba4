//! A work table and the SQL that claims, completes and counts its items.
//!
//! Every statement is rendered once, when the [`WorkQueue`] is built, from
//! identifiers that [`QueueSpec`] has validated; values are always bound
//! parameters. This module is the one place the engine's SQL lives.

use std::time::Duration;

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::{EngineError, ItemStatus};

/// Indexes a work table needs (besides its primary key on (scope, key)):
/// claims and progress counts read only what is still to do.
pub const REQUIRED_INDEXES: &[&str] = &[
    "(scope, key) WHERE status = 'eligible'",
    "(scope, lease_until) WHERE status = 'processing'",
];

/// Columns a work table must have besides its scope and key columns.
pub const REQUIRED_COLUMNS: &[(&str, &str)] = &[
    ("status", "text: one of eligible, processing, settled, failed, held"),
    (
        "attempt",
        "integer NOT NULL DEFAULT 0: the fence, raised by every claim",
    ),
    ("lease_owner", "uuid: the worker holding a lease"),
    ("lease_until", "timestamptz: when the lease expires (database clock)"),
    ("not_before", "timestamptz: do not claim before (retry backoff)"),
    ("last_error", "text: why the last attempt failed"),
    ("updated_at", "timestamptz: last change"),
];

/// Largest chunk one claim may take.
pub const MAX_CHUNK_ITEMS: u32 = 10_000;

/// Describes a work table. All fields are SQL identifiers (or type names),
/// validated by [`WorkQueue::new`].
#[derive(Debug, Clone)]
pub struct QueueSpec {
    /// The job's name, as stored in `settled_engine.runs.job`.
    pub job: String,
    /// The work table, `schema.table` or `table`.
    pub table: String,
    /// The column that one run covers (e.g. `period`).
    pub scope_column: String,
    /// Its SQL type (e.g. `date`).
    pub scope_type: String,
    /// The column that identifies an item within a scope (e.g. `creator`).
    pub key_column: String,
    /// Its SQL type (e.g. `text`).
    pub key_type: String,
}

/// A validated work table with its rendered statements.
#[derive(Debug, Clone)]
pub struct WorkQueue {
    spec: QueueSpec,
    sql: QueueSql,
}

#[derive(Debug, Clone)]
struct QueueSql {
    claim_in_tx: String,
    lock_keys_in_tx: String,
    mark_settled_in_tx: String,
    mark_held_in_tx: String,
    hold_fenced: String,
    fail_unclaimed: String,
    claim_leased: String,
    renew_leases: String,
    complete_fenced: String,
    fail_fenced: String,
    release_leases: String,
    release_scope: String,
    rescue_expired: String,
    count_unfinished: String,
    count_by_status: String,
    analyze: String,
    stale_statistics: String,
}

fn check_identifier(field: &'static str, value: &str, allow_schema: bool) -> Result<(), EngineError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let parts: Vec<&str> = value.split('.').collect();
    let ok = match parts.as_slice() {
        [one] => part_ok(one),
        [schema, name] if allow_schema => part_ok(schema) && part_ok(name),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(EngineError::InvalidIdentifier {
            field,
            value: value.to_string(),
        })
    }
}

impl WorkQueue {
    /// Validates the spec and renders the queue's statements.
    pub fn new(spec: QueueSpec) -> Result<WorkQueue, EngineError> {
        check_identifier("table", &spec.table, true)?;
        check_identifier("scope_column", &spec.scope_column, false)?;
        check_identifier("scope_type", &spec.scope_type, false)?;
        check_identifier("key_column", &spec.key_column, false)?;
        check_identifier("key_type", &spec.key_type, false)?;
        if spec.job.is_empty() || spec.job.len() > 100 {
            return Err(EngineError::InvalidIdentifier {
                field: "job",
                value: spec.job.clone(),
            });
        }
        let QueueSpec {
            table,
            scope_column: scope,
            scope_type,
            key_column: key,
            key_type,
            ..
        } = &spec;

        // Claim for in-transaction mode: the row locks are the claim, held
        // until commit; the status is re-checked when the items are marked.
        // Locking rows straight from the SELECT (no `key IN (subquery)`)
        // locks exactly the rows returned, never more.
        let claim_in_tx = format!(
            "SELECT t.{key}::text AS key, t.attempt + 1 AS fence
             FROM {table} t
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.status = 'eligible'
               AND (t.not_before IS NULL OR t.not_before <= now())
               AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running')
             LIMIT $2
             FOR NO KEY UPDATE OF t SKIP LOCKED"
        );
        // Re-locks chosen keys (retrying halves of a failed chunk).
        let lock_keys_in_tx = format!(
            "SELECT t.{key}::text AS key, t.attempt + 1 AS fence
             FROM {table} t
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.{key} = ANY(CAST($2 AS {key_type}[]))
               AND t.status = 'eligible'
             FOR NO KEY UPDATE OF t SKIP LOCKED"
        );
        let mark_settled_in_tx = format!(
            "UPDATE {table}
             SET status = 'settled', attempt = attempt + 1, lease_owner = NULL,
                 lease_until = NULL, last_error = NULL, not_before = NULL, updated_at = now()
             WHERE {scope} = CAST($1 AS {scope_type})
               AND {key} = ANY(CAST($2 AS {key_type}[]))
               AND status = 'eligible'"
        );
        // Items the application put on hold: not worked on in this run.
        let mark_held_in_tx = format!(
            "UPDATE {table}
             SET status = 'held', attempt = attempt + 1, lease_owner = NULL,
                 lease_until = NULL, updated_at = now()
             WHERE {scope} = CAST($1 AS {scope_type})
               AND {key} = ANY(CAST($2 AS {key_type}[]))
               AND status = 'eligible'"
        );
        let hold_fenced = format!(
            "UPDATE {table} t
             SET status = 'held', lease_owner = NULL, lease_until = NULL, updated_at = now()
             FROM unnest(CAST($2 AS {key_type}[]), CAST($3 AS integer[])) AS f(key, fence)
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.{key} = f.key AND t.attempt = f.fence AND t.status = 'processing'"
        );
        // The retry decision, shared by both modes and the rescuer: a
        // permanent error or the last allowed attempt fails the item;
        // otherwise it waits base * 2^(attempt-1) ms, capped, times a jitter
        // in [0.5, 1). Arguments are SQL expressions (placeholders).
        let retry_set = |attempt: &str, error: &str, permanent: &str, max: &str, base: &str, cap: &str| {
            format!(
                "status = CASE WHEN {permanent} OR {attempt} - t.attempt_base >= {max} THEN 'failed' ELSE 'eligible' END,
                 not_before = CASE WHEN {permanent} OR {attempt} - t.attempt_base >= {max} THEN NULL
                     ELSE now() + least({cap}::float8, {base}::float8 * power(2, greatest({attempt} - t.attempt_base - 1, 0)))
                                  * (0.5 + random() / 2) * interval '1 millisecond' END,
                 last_error = {error}, lease_owner = NULL, lease_until = NULL, updated_at = now()"
            )
        };
        // In-transaction mode: the failed attempt was never recorded (it
        // rolled back), so count it here.
        let fail_unclaimed = format!(
            "UPDATE {table} t
             SET attempt = t.attempt + 1, {}
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.{key} = ANY(CAST($2 AS {key_type}[]))
               AND t.status = 'eligible'
             RETURNING t.status",
            retry_set("t.attempt + 1", "$3", "$4", "$5", "$6", "$7")
        );
        // Leased mode: a short transaction of its own claims and commits the
        // lease; the CTE is joined back on the key and the status re-checked.
        // $4 worker, $5 ttl ms.
        let claim_leased = format!(
            "WITH picked AS (
                 SELECT t.{scope} AS scope, t.{key} AS key
                 FROM {table} t
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.status = 'eligible'
                   AND (t.not_before IS NULL OR t.not_before <= now())
                   AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running')
                 LIMIT $2
                 FOR NO KEY UPDATE OF t SKIP LOCKED)
             UPDATE {table} t
             SET status = 'processing', attempt = t.attempt + 1, lease_owner = $4,
                 lease_until = now() + $5 * interval '1 millisecond', updated_at = now()
             FROM picked
             WHERE t.{scope} = picked.scope AND t.{key} = picked.key AND t.status = 'eligible'
             RETURNING t.{key}::text AS key, t.attempt AS fence"
        );
        // One statement per worker per heartbeat, for the leases it knows it
        // holds. A lease whose claim committed but whose answer was lost
        // (the connection dropped) is not renewed: it expires and is rescued.
        let renew_leases = format!(
            "UPDATE {table} t
             SET lease_until = now() + $2 * interval '1 millisecond'
             FROM unnest(CAST($3 AS {key_type}[]), CAST($4 AS integer[])) AS f(key, fence)
             WHERE t.{key} = f.key AND t.attempt = f.fence
               AND t.status = 'processing' AND t.lease_owner = $1
             RETURNING t.{key}::text AS key, t.attempt AS fence"
        );
        // The fenced write: only the claim that holds the item's current
        // attempt can complete it. Returns the keys it accepted.
        let complete_fenced = format!(
            "UPDATE {table} t
             SET status = 'settled', lease_owner = NULL, lease_until = NULL,
                 last_error = NULL, not_before = NULL, updated_at = now()
             FROM unnest(CAST($2 AS {key_type}[]), CAST($3 AS integer[])) AS f(key, fence)
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.{key} = f.key AND t.attempt = f.fence AND t.status = 'processing'
             RETURNING t.{key}::text AS key"
        );
        let fail_fenced = format!(
            "UPDATE {table} t
             SET {}
             FROM unnest(CAST($2 AS {key_type}[]), CAST($8 AS integer[])) AS f(key, fence)
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.{key} = f.key AND t.attempt = f.fence AND t.status = 'processing'
             RETURNING t.status",
            retry_set("t.attempt", "$3", "$4", "$5", "$6", "$7")
        );
        // Graceful shutdown: give back what a worker holds, attempt kept.
        let release_leases = format!(
            "UPDATE {table}
             SET status = 'eligible', lease_owner = NULL, lease_until = NULL, updated_at = now()
             WHERE status = 'processing' AND lease_owner = $1
               AND ($2::{key_type}[] IS NULL OR {key} = ANY($2::{key_type}[]))"
        );
        // Cancelling a run: every lease of the scope is given back.
        let release_scope = format!(
            "UPDATE {table}
             SET status = 'eligible', lease_owner = NULL, lease_until = NULL, updated_at = now()
             WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'processing'"
        );
        // Expired leases of a scope go back to eligible after a backoff, or
        // fail once their attempts are spent.
        // SKIP LOCKED: a row locked by a completing transaction is left to it.
        let rescue_expired = format!(
            "WITH expired AS (
                 SELECT t.{scope} AS scope, t.{key} AS key
                 FROM {table} t
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.status = 'processing' AND t.lease_until < now()
                 FOR NO KEY UPDATE OF t SKIP LOCKED)
             UPDATE {table} t
             SET {}
             FROM expired
             WHERE t.{scope} = expired.scope AND t.{key} = expired.key
               AND t.status = 'processing' AND t.lease_until < now()
             RETURNING t.status",
            retry_set(
                "t.attempt",
                "'lease expired: worker ' || coalesce(t.lease_owner::text, '?') || ' stopped renewing'",
                "false",
                "$2",
                "$3",
                "$4"
            )
        );
        // Two counts, each answered from its partial index (eligible,
        // processing), so polling progress stays cheap on a large scope.
        let count_unfinished = format!(
            "SELECT (SELECT count(*) FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'eligible')
                  + (SELECT count(*) FROM {table} WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'processing')"
        );
        let count_by_status = format!(
            "SELECT status, count(*) FROM {table}
             WHERE {scope} = CAST($1 AS {scope_type}) GROUP BY status"
        );
        let analyze = format!("ANALYZE {table}");
        let stale_statistics = "SELECT coalesce(n_mod_since_analyze > greatest(1000, n_live_tup / 10), true)
             FROM pg_stat_user_tables WHERE relid = to_regclass($1)"
            .to_string();
        Ok(WorkQueue {
            sql: QueueSql {
                claim_in_tx,
                lock_keys_in_tx,
                mark_settled_in_tx,
                mark_held_in_tx,
                hold_fenced,
                fail_unclaimed,
                claim_leased,
                renew_leases,
                complete_fenced,
                fail_fenced,
                release_leases,
                release_scope,
                rescue_expired,
                count_unfinished,
                count_by_status,
                analyze,
                stale_statistics,
            },
            spec,
        })
    }

    /// The spec this queue was built from.
    pub fn spec(&self) -> &QueueSpec {
        &self.spec
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.spec.job
    }

    /// Locks up to `limit` eligible items of `scope` for the current
    /// transaction, skipping rows other transactions hold. Returns nothing
    /// when run `run_id` is not running.
    pub async fn claim_chunk_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        limit: u32,
        run_id: i64,
    ) -> Result<Vec<(String, i32)>, EngineError> {
        debug_assert!((1..=MAX_CHUNK_ITEMS).contains(&limit));
        let rows = sqlx::query(&self.sql.claim_in_tx)
            .bind(scope)
            .bind(i64::from(limit))
            .bind(run_id)
            .fetch_all(tx)
            .await
            .map_err(EngineError::db("claiming a chunk"))?;
        read_keyed(&rows, "reading a claimed chunk")
    }

    /// Re-locks the still-eligible items among `keys` in the current
    /// transaction (skipping any another transaction holds).
    pub async fn lock_keys_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        keys: &[String],
    ) -> Result<Vec<(String, i32)>, EngineError> {
        let rows = sqlx::query(&self.sql.lock_keys_in_tx)
            .bind(scope)
            .bind(keys)
            .fetch_all(tx)
            .await
            .map_err(EngineError::db("re-locking items"))?;
        read_keyed(&rows, "reading re-locked items")
    }

    /// In-transaction mode: marks claimed items `held` (the application
    /// refuses to work on them now). Fails unless every item is still eligible.
    pub async fn mark_held_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        keys: &[String],
    ) -> Result<(), EngineError> {
        mark_every_claimed(tx, &self.sql.mark_held_in_tx, scope, keys, "held").await
    }

    /// Leased mode: marks items `held` if their fence still holds.
    pub async fn hold_fenced(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        items: &[(String, i32)],
    ) -> Result<u64, EngineError> {
        let (keys, fences): (Vec<String>, Vec<i32>) = items.iter().cloned().unzip();
        Ok(sqlx::query(&self.sql.hold_fenced)
            .bind(scope)
            .bind(keys)
            .bind(fences)
            .execute(conn)
            .await
            .map_err(EngineError::db("marking leased items held"))?
            .rows_affected())
    }

    /// In-transaction mode: records a failed attempt on eligible items (after
    /// the attempt's transaction rolled back): retry later, or `failed`.
    pub async fn fail_unclaimed(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[String],
        error: &str,
        permanent: bool,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        record_failure(
            conn,
            &self.sql.fail_unclaimed,
            scope,
            keys,
            None,
            error,
            permanent,
            policy,
        )
        .await
    }

    /// Leased mode: claims up to `limit` items and commits their leases
    /// (`processing`, owner, expiry `now() + ttl` on the database clock,
    /// `attempt + 1`). Returns each item's key and fence.
    pub async fn claim_leased(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        limit: u32,
        run_id: i64,
        worker: Uuid,
        ttl: Duration,
    ) -> Result<Vec<(String, i32)>, EngineError> {
        debug_assert!((1..=MAX_CHUNK_ITEMS).contains(&limit));
        let rows = sqlx::query(&self.sql.claim_leased)
            .bind(scope)
            .bind(i64::from(limit))
            .bind(run_id)
            .bind(worker)
            .bind(ttl.as_millis() as i64)
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("claiming a leased chunk"))?;
        read_keyed(&rows, "reading a leased chunk")
    }

    /// Extends the leases `worker` holds with these (key, fence) pairs to
    /// `now() + ttl`, in one statement. Returns the pairs it still holds.
    pub async fn renew_leases(
        &self,
        conn: &mut PgConnection,
        worker: Uuid,
        ttl: Duration,
        held: &[(String, i32)],
    ) -> Result<Vec<(String, i32)>, EngineError> {
        let (keys, fences): (Vec<String>, Vec<i32>) = held.iter().cloned().unzip();
        let rows = sqlx::query(&self.sql.renew_leases)
            .bind(worker)
            .bind(ttl.as_millis() as i64)
            .bind(keys)
            .bind(fences)
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("renewing leases"))?;
        read_keyed(&rows, "reading renewed leases")
    }

    /// The fenced completion: marks `settled` exactly those items whose
    /// attempt still equals the fence they were claimed with. Returns the
    /// accepted keys; the caller writes the effects of those only, in the
    /// same transaction.
    pub async fn complete_fenced(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        items: &[(String, i32)],
    ) -> Result<Vec<String>, EngineError> {
        let (keys, fences): (Vec<String>, Vec<i32>) = items.iter().cloned().unzip();
        sqlx::query_scalar(&self.sql.complete_fenced)
            .bind(scope)
            .bind(keys)
            .bind(fences)
            .fetch_all(tx)
            .await
            .map_err(EngineError::db("completing fenced items"))
    }

    /// Leased mode: records a failed attempt on items still held with these
    /// fences: retry later, or `failed`.
    pub async fn fail_fenced(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        items: &[(String, i32)],
        error: &str,
        permanent: bool,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        let (keys, fences): (Vec<String>, Vec<i32>) = items.iter().cloned().unzip();
        record_failure(
            conn,
            &self.sql.fail_fenced,
            scope,
            &keys,
            Some(fences),
            error,
            permanent,
            policy,
        )
        .await
    }

    /// Gives back leases `worker` holds (all of them, or only `keys`):
    /// eligible again at once, attempt kept.
    pub async fn release_leases(
        &self,
        conn: &mut PgConnection,
        worker: Uuid,
        keys: Option<&[String]>,
    ) -> Result<u64, EngineError> {
        Ok(sqlx::query(&self.sql.release_leases)
            .bind(worker)
            .bind(keys)
            .execute(conn)
            .await
            .map_err(EngineError::db("releasing leases"))?
            .rows_affected())
    }

    /// Gives back every lease of `scope` (a cancelled run): eligible again,
    /// attempt kept. A worker still working on one is refused at completion.
    pub async fn release_scope(&self, conn: &mut PgConnection, scope: &str) -> Result<u64, EngineError> {
        Ok(sqlx::query(&self.sql.release_scope)
            .bind(scope)
            .execute(conn)
            .await
            .map_err(EngineError::db("releasing a scope's leases"))?
            .rows_affected())
    }

    /// Returns the scope's expired leases to `eligible` (after a backoff) or
    /// `failed` (attempts spent). See [`crate::rescuer`] for running it.
    pub async fn rescue_expired(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, EngineError> {
        let statuses: Vec<String> = sqlx::query_scalar(&self.sql.rescue_expired)
            .bind(scope)
            .bind(policy.max_attempts)
            .bind(policy.backoff_base_ms as i64)
            .bind(policy.backoff_cap_ms as i64)
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("rescuing expired leases"))?;
        Ok(FailOutcome::count(&statuses))
    }

    /// Marks claimed items `settled` in the claiming transaction. Fails (and
    /// the caller must roll back) unless every item is still `eligible`.
    pub async fn mark_settled_in_tx(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        keys: &[String],
    ) -> Result<(), EngineError> {
        mark_every_claimed(tx, &self.sql.mark_settled_in_tx, scope, keys, "settled").await
    }

    /// Refreshes the planner's statistics of the work table. A scope loaded
    /// just before its run (and not yet seen by autovacuum) otherwise looks
    /// empty to the planner, which then scans the whole scope per statement
    /// instead of looking items up by key. Needs ownership of the table.
    /// Skipped (returning false) while the statistics are fresh: fewer than
    /// 10% of the rows changed since the last analyze.
    pub async fn refresh_statistics(&self, conn: &mut PgConnection) -> Result<bool, EngineError> {
        let stale: Option<bool> = sqlx::query_scalar(&self.sql.stale_statistics)
            .bind(&self.spec.table)
            .fetch_optional(&mut *conn)
            .await
            .map_err(EngineError::db("reading the work table's statistics"))?;
        if stale == Some(false) {
            return Ok(false);
        }
        sqlx::query(&self.sql.analyze)
            .execute(conn)
            .await
            .map_err(EngineError::db("analyzing the work table"))?;
        Ok(true)
    }

    /// Exact count of items of `scope` still to do (eligible or processing),
    /// from committed state: never SKIP LOCKED, which would hide rows.
    pub async fn count_unfinished(&self, conn: &mut PgConnection, scope: &str) -> Result<i64, EngineError> {
        sqlx::query_scalar(&self.sql.count_unfinished)
            .bind(scope)
            .fetch_one(conn)
            .await
            .map_err(EngineError::db("counting unfinished items"))
    }

    /// Exact counts by status for `scope` (every status present, zero if none).
    pub async fn count_by_status(
        &self,
        conn: &mut PgConnection,
        scope: &str,
    ) -> Result<Vec<(ItemStatus, i64)>, EngineError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&self.sql.count_by_status)
            .bind(scope)
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("counting items by status"))?;
        let mut counts: Vec<(ItemStatus, i64)> = ItemStatus::ALL.iter().map(|s| (*s, 0)).collect();
        for (status, n) in rows {
            let parsed = ItemStatus::parse(&status)
                .ok_or_else(|| EngineError::Invariant(format!("unknown item status {status:?}")))?;
            if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == parsed) {
                slot.1 = n;
            }
        }
        Ok(counts)
    }
}

/// Runs one of the two failure statements (they share parameters $1..$7;
/// the fenced one adds the fences as $8) and counts what it decided.
#[allow(clippy::too_many_arguments)]
async fn record_failure(
    conn: &mut PgConnection,
    sql: &str,
    scope: &str,
    keys: &[String],
    fences: Option<Vec<i32>>,
    error: &str,
    permanent: bool,
    policy: &RetryPolicy,
) -> Result<FailOutcome, EngineError> {
    let mut query = sqlx::query_scalar(sql)
        .bind(scope)
        .bind(keys)
        .bind(error)
        .bind(permanent)
        .bind(policy.max_attempts)
        .bind(policy.backoff_base_ms as i64)
        .bind(policy.backoff_cap_ms as i64);
    if let Some(fences) = fences {
        query = query.bind(fences);
    }
    let statuses: Vec<String> = query
        .fetch_all(conn)
        .await
        .map_err(EngineError::db("recording a failed attempt"))?;
    Ok(FailOutcome::count(&statuses))
}

/// Runs a status change on claimed items; anything but exactly one row per
/// key means the claim did not hold, and the caller must roll back.
async fn mark_every_claimed(
    tx: &mut PgConnection,
    sql: &str,
    scope: &str,
    keys: &[String],
    status: &str,
) -> Result<(), EngineError> {
    let done = sqlx::query(sql)
        .bind(scope)
        .bind(keys)
        .execute(tx)
        .await
        .map_err(EngineError::db("marking claimed items"))?
        .rows_affected();
    if done != keys.len() as u64 {
        return Err(EngineError::Invariant(format!(
            "marked {done} of {} claimed items {status}; rolling the chunk back",
            keys.len()
        )));
    }
    Ok(())
}

fn read_keyed(rows: &[sqlx::postgres::PgRow], context: &'static str) -> Result<Vec<(String, i32)>, EngineError> {
    rows.iter()
        .map(|r| Ok((r.try_get("key")?, r.try_get("fence")?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(EngineError::db(context))
}

/// When a failed attempt may be retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts before an item goes to `failed`.
    pub max_attempts: i32,
    /// First backoff, in milliseconds (doubles per attempt).
    pub backoff_base_ms: u64,
    /// Longest backoff, in milliseconds.
    pub backoff_cap_ms: u64,
}

/// Default attempts before `failed`.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;

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
    fn count(statuses: &[String]) -> FailOutcome {
        let failed = statuses.iter().filter(|s| *s == "failed").count() as u64;
        FailOutcome {
            retried: statuses.len() as u64 - failed,
            failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> QueueSpec {
        QueueSpec {
            job: "j".into(),
            table: "s.t".into(),
            scope_column: "period".into(),
            scope_type: "date".into(),
            key_column: "k".into(),
            key_type: "text".into(),
        }
    }

    #[test]
    fn rejects_identifiers_that_are_not_plain_names() {
        for bad in ["t; drop table x", "T", "a.b.c", "", "1t", "t\"", "a b"] {
            let mut s = spec();
            s.table = bad.into();
            assert!(WorkQueue::new(s).is_err(), "{bad:?} accepted");
        }
        let mut s = spec();
        s.key_type = "text[]".into();
        assert!(WorkQueue::new(s).is_err());
        assert!(WorkQueue::new(spec()).is_ok());
    }
}
