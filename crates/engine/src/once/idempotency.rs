//! Idempotency keys, with the semantics of Stripe and the IETF
//! `Idempotency-Key` draft: the first request with a key stores its
//! fingerprint (method, path, body hash) and, once done, its final response.
//! A repeat with the same fingerprint gets the stored response; a repeat while
//! the first is still running gets "in progress" (HTTP 409); the same key
//! with a different fingerprint is refused (HTTP 422). Keys expire after a
//! retention period and are pruned.
//!
//! One rule decides whose a key is: a key belongs to the request that
//! stored its answer for as long as that answer is kept, expired or not,
//! until [`prune`] deletes it; no other request takes it over meanwhile
//! ([`Begin::Mismatch`]). An application whose request leaves a lasting
//! trace of its own (a payout naming its key) keeps the key that request's
//! beyond the pruning: it gives a claim by another request back with
//! [`abandon`] instead of storing an answer under the key. Past its
//! retention, a key is run again only by a repeat of its own request.
//!
//! The first attempt owns the key until `locked_until`; until then any
//! other request with the key is "in progress" (the attempt may yet fail
//! and give the key back). If it crashes before finishing (so nothing it
//! did committed with the response), a request after that time takes the
//! key over and runs.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), settled_engine::EngineError> {
//! use std::time::Duration;
//! use settled_engine::once::idempotency::{begin, fingerprint, Begin, IdempotencyConfig};
//!
//! let cfg = IdempotencyConfig::default();
//! let fp = fingerprint("POST", "/v1/payouts", br#"{"amount":"5"}"#);
//! match begin(&pool, "payouts", "key-123", &fp, &cfg).await? {
//!     Begin::New => {
//!         let mut tx = pool.begin().await.unwrap();
//!         // ... the request's effects on `tx` ...
//!         settled_engine::once::idempotency::finish(&mut tx, "payouts", "key-123", 201, &serde_json::json!({"id": 1})).await?;
//!         tx.commit().await.unwrap();
//!     }
//!     Begin::Replay { status, body } => { /* answer `status` with `body` */ }
//!     Begin::InProgress => { /* 409 */ }
//!     Begin::Mismatch => { /* 422 */ }
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use crate::common::error::EngineError;

/// Longest idempotency key accepted, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// Retention and locking of keys.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyConfig {
    /// How long a key (and its stored response) is kept.
    pub retention: Duration,
    /// How long a first attempt owns an unfinished key.
    pub lock: Duration,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            retention: Duration::from_secs(24 * 3600),
            lock: Duration::from_secs(60),
        }
    }
}

/// What to do with a request carrying a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// First time (or a crashed attempt taken over): run the request, then [`finish`].
    New,
    /// Done before: answer with the stored response.
    Replay {
        /// Stored HTTP status.
        status: u16,
        /// Stored body.
        body: serde_json::Value,
    },
    /// The first request with this key is still running.
    InProgress,
    /// The key belongs to a different request, whose answer is kept.
    Mismatch,
}

/// A request's fingerprint: method, path and a SHA-256 of the body.
pub fn fingerprint(method: &str, path: &str, body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(body);
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{method} {path} {hex}")
}

/// Claims `key` in `scope` for a request with `fingerprint`, or says why not.
pub async fn begin(
    pool: &PgPool,
    scope: &str,
    key: &str,
    fingerprint: &str,
    cfg: &IdempotencyConfig,
) -> Result<Begin, EngineError> {
    if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
        return Err(EngineError::Invariant(format!(
            "idempotency key must be 1..={MAX_IDEMPOTENCY_KEY_CHARS} characters"
        )));
    }
    // Insert, or take over an attempt that crashed (its lock expired), or
    // a key past its retention for a repeat of its own request; one
    // statement, so two racing requests cannot both win.
    let won: Option<bool> = sqlx::query_scalar(
        "INSERT INTO settled_engine.idempotency_keys AS k
             (scope, key, fingerprint, locked_until, expires_at)
         VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond', now() + $5 * interval '1 millisecond')
         ON CONFLICT (scope, key) DO UPDATE
         SET fingerprint = EXCLUDED.fingerprint, status = 'in_progress',
             locked_until = EXCLUDED.locked_until, response_status = NULL, response_body = NULL,
             created_at = now(), completed_at = NULL, expires_at = EXCLUDED.expires_at
         WHERE (k.status = 'in_progress' AND k.locked_until <= now())
            OR (k.expires_at <= now() AND k.fingerprint = EXCLUDED.fingerprint)
         RETURNING true",
    )
    .bind(scope)
    .bind(key)
    .bind(fingerprint)
    .bind(cfg.lock.as_millis() as i64)
    .bind(cfg.retention.as_millis() as i64)
    .fetch_optional(pool)
    .await
    .map_err(EngineError::db("claiming an idempotency key"))?;
    if won.is_some() {
        return Ok(Begin::New);
    }
    let existing: Option<StoredKey> = sqlx::query_as(
        "SELECT fingerprint, status, response_status, response_body
         FROM settled_engine.idempotency_keys WHERE scope = $1 AND key = $2",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(pool)
    .await
    .map_err(EngineError::db("reading an idempotency key"))?;
    Ok(match existing {
        // Pruned between our two statements: treat as in progress; the client retries.
        None => Begin::InProgress,
        // Unfinished: whoever it belongs to is not known until it finishes.
        Some(stored) if stored.status != "completed" => Begin::InProgress,
        Some(stored) if stored.fingerprint != fingerprint => Begin::Mismatch,
        Some(StoredKey {
            response_status: Some(code),
            response_body,
            ..
        }) => Begin::Replay {
            status: code as u16,
            body: response_body.unwrap_or(serde_json::Value::Null),
        },
        Some(_) => Begin::InProgress,
    })
}

/// A key as stored: whose request it was, and its answer once completed.
#[derive(sqlx::FromRow)]
struct StoredKey {
    fingerprint: String,
    status: String,
    response_status: Option<i32>,
    response_body: Option<serde_json::Value>,
}

/// Stores the final response, in the same transaction as the request's
/// effects, so both commit or neither does.
pub async fn finish(
    tx: &mut PgConnection,
    scope: &str,
    key: &str,
    status: u16,
    body: &serde_json::Value,
) -> Result<(), EngineError> {
    let done = sqlx::query(
        "UPDATE settled_engine.idempotency_keys
         SET status = 'completed', response_status = $3, response_body = $4,
             completed_at = now(), locked_until = NULL
         WHERE scope = $1 AND key = $2 AND status = 'in_progress'",
    )
    .bind(scope)
    .bind(key)
    .bind(i32::from(status))
    .bind(body)
    .execute(tx)
    .await
    .map_err(EngineError::db("storing an idempotent response"))?
    .rows_affected();
    if done != 1 {
        return Err(EngineError::Invariant(format!(
            "idempotency key {key:?} was not in progress when its response was stored"
        )));
    }
    Ok(())
}

/// Forgets an unfinished key (the request failed before any effect and its
/// answer should not be replayed, e.g. a 5xx), so a retry runs again.
pub async fn abandon(pool: &PgPool, scope: &str, key: &str) -> Result<(), EngineError> {
    sqlx::query("DELETE FROM settled_engine.idempotency_keys WHERE scope = $1 AND key = $2 AND status = 'in_progress'")
        .bind(scope)
        .bind(key)
        .execute(pool)
        .await
        .map_err(EngineError::db("abandoning an idempotency key"))?;
    Ok(())
}

/// Deletes expired keys; returns how many.
pub async fn prune(pool: &PgPool) -> Result<u64, EngineError> {
    Ok(
        sqlx::query("DELETE FROM settled_engine.idempotency_keys WHERE expires_at <= now()")
            .execute(pool)
            .await
            .map_err(EngineError::db("pruning idempotency keys"))?
            .rows_affected(),
    )
}
