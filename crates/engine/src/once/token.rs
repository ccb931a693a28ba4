//! One-time tokens: issued for a purpose and subject with an expiry, then
//! reserved by exactly one caller with one conditional update, then completed
//! (or released back). Timed by the database clock.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), settled_engine::EngineError> {
//! use std::time::Duration;
//! use settled_engine::once::token::OnceToken;
//!
//! let token = OnceToken::issue(&pool, "withdrawal-confirmation", "0xabc...", Duration::from_secs(600)).await?;
//! // Two requests race with the same token: exactly one reserves it.
//! if OnceToken::reserve(&pool, token, "withdrawal-confirmation").await? {
//!     // ... do the once-only thing ...
//!     OnceToken::complete(&pool, token).await?;
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::common::error::EngineError;

/// Longest validity of a token.
pub const MAX_TOKEN_TTL_SECS: u64 = 30 * 24 * 3600;

/// One-time tokens (namespace for the operations on `settled_engine.once_tokens`).
pub struct OnceToken;

impl OnceToken {
    /// Issues a token for `purpose` and `subject`, valid for `ttl`.
    pub async fn issue(pool: &PgPool, purpose: &str, subject: &str, ttl: Duration) -> Result<Uuid, EngineError> {
        let mut conn = pool.acquire().await.map_err(EngineError::db("issuing a token"))?;
        OnceToken::issue_in(&mut conn, purpose, subject, ttl).await
    }

    /// Moves the token `issued -> reserved` if it is for `purpose` and not
    /// expired. Exactly one concurrent caller gets `true`.
    pub async fn reserve(pool: &PgPool, token: Uuid, purpose: &str) -> Result<bool, EngineError> {
        let reserve = sqlx::query(
            "UPDATE settled_engine.once_tokens SET status = 'reserved', reserved_at = now()
             WHERE id = $1 AND purpose = $2 AND status = 'issued' AND expires_at > now()",
        );
        moved_one(pool, reserve.bind(token).bind(purpose), "reserving a token").await
    }

    /// Moves a reserved token to `completed`: it can never be used again.
    pub async fn complete(pool: &PgPool, token: Uuid) -> Result<bool, EngineError> {
        let complete = sqlx::query(
            "UPDATE settled_engine.once_tokens SET status = 'completed', completed_at = now()
             WHERE id = $1 AND status = 'reserved'",
        );
        moved_one(pool, complete.bind(token), "completing a token").await
    }

    /// Gives a reserved token back (`reserved -> issued`), e.g. after the
    /// once-only work failed without effect.
    pub async fn release(pool: &PgPool, token: Uuid) -> Result<bool, EngineError> {
        let release = sqlx::query(
            "UPDATE settled_engine.once_tokens SET status = 'issued', reserved_at = NULL
             WHERE id = $1 AND status = 'reserved'",
        );
        moved_one(pool, release.bind(token), "releasing a token").await
    }

    /// Issues a token on the caller's connection or transaction (it exists
    /// only if that transaction commits), for `purpose` and `subject`,
    /// valid for `ttl`.
    pub async fn issue_in(
        conn: &mut PgConnection,
        purpose: &str,
        subject: &str,
        ttl: Duration,
    ) -> Result<Uuid, EngineError> {
        if ttl.as_secs() > MAX_TOKEN_TTL_SECS {
            return Err(EngineError::Invariant(format!(
                "token ttl must be at most {MAX_TOKEN_TTL_SECS} s"
            )));
        }
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO settled_engine.once_tokens (id, purpose, subject, expires_at)
             VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')",
        )
        .bind(id) // $1
        .bind(purpose) // $2
        .bind(subject) // $3
        .bind(ttl.as_millis() as i64) // $4
        .execute(conn)
        .await
        .map_err(EngineError::db("issuing a token"))?;
        Ok(id)
    }

    /// Uses the token up in one conditional update on the caller's
    /// transaction (`issued -> completed`), if it is for `purpose` and
    /// `subject` and not expired: of racing callers exactly one gets
    /// `true`, and it is used up only if that transaction commits.
    pub async fn redeem_in(
        conn: &mut PgConnection,
        token: Uuid,
        purpose: &str,
        subject: &str,
    ) -> Result<bool, EngineError> {
        Ok(OnceToken::redemption_in(conn, token, purpose, subject).await? == Redemption::Redeemed)
    }

    /// As [`OnceToken::redeem_in`], saying why a redemption did nothing:
    /// the token expired unused, or it is refused (unknown, for another
    /// purpose or subject, or used). The statement is the database's
    /// `settled_engine.redeem_once_token`, which an application's own SQL
    /// function may call to redeem a token inside it.
    pub async fn redemption_in(
        conn: &mut PgConnection,
        token: Uuid,
        purpose: &str,
        subject: &str,
    ) -> Result<Redemption, EngineError> {
        let answer: String = sqlx::query_scalar("SELECT settled_engine.redeem_once_token($1, $2, $3)")
            .bind(token) // $1
            .bind(purpose) // $2
            .bind(subject) // $3
            .fetch_one(conn)
            .await
            .map_err(EngineError::db("redeeming a token"))?;
        Redemption::parse(&answer)
            .ok_or_else(|| EngineError::Invariant(format!("redeem_once_token answered {answer:?}")))
    }
}

/// Runs one conditional update of a token: true when it moved the row.
async fn moved_one(
    pool: &PgPool,
    update: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    context: &'static str,
) -> Result<bool, EngineError> {
    let done = update
        .execute(pool)
        .await
        .map_err(EngineError::db(context))?
        .rows_affected();
    Ok(done == 1)
}

/// What a redemption did (`settled_engine.redeem_once_token`'s answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redemption {
    /// Used up now: of racing callers, exactly one.
    Redeemed,
    /// For that purpose and subject, unused, and past its expiry.
    Expired,
    /// Unknown, for another purpose or subject, or already used.
    Refused,
}

impl Redemption {
    /// The database's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Redemption::Redeemed => "redeemed",
            Redemption::Expired => "expired",
            Redemption::Refused => "refused",
        }
    }

    /// Reads the database's word (`redeemed`, `expired`, `refused`).
    pub fn parse(word: &str) -> Option<Redemption> {
        [Redemption::Redeemed, Redemption::Expired, Redemption::Refused]
            .into_iter()
            .find(|r| r.as_str() == word)
    }
}
