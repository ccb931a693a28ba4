//! Named API tokens with roles: made, listed and revoked by `settled
//! tokens`, looked up by every request of `settled serve`. Only the
//! SHA-256 of a token is stored; the token itself is shown once, when made.
//! Never: a token in a log, an error or the database.

use chrono::{DateTime, Utc};
use sha2::Digest;
use sqlx::PgConnection;

/// What a token may do; each role may do all that the ones below it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything: `/v1` reads and the dashboard.
    Viewer,
    /// A viewer that also creates, confirms and cancels payouts and places
    /// and releases holds.
    App,
    /// An app that also retries items, pauses, resumes, replays and cancels
    /// queues, and cancels runs.
    Operator,
    /// An operator that also manages tokens.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 4] = [Role::Viewer, Role::App, Role::Operator, Role::Admin];

    /// As stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::App => "app",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// The role named `text`.
    pub(crate) fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who made a request: a token's name and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Actor {
    /// The token's name (`env` for `SETTLED_API_TOKEN`).
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// The name `SETTLED_API_TOKEN` goes by: an admin token.
pub(crate) const ENV_TOKEN_NAME: &str = "env";
/// Random bytes in a token.
pub(crate) const TOKEN_BYTES: usize = 32;
/// How stale a token's `last_used_at` may get before a request refreshes it
/// (so a busy token costs no write per request).
pub(crate) const LAST_USE_RESOLUTION_SECS: i64 = 60;

/// The SHA-256 of `token`, in lower-case hex: what is stored.
pub(crate) fn digest(token: &str) -> String {
    hex(&sha2::Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new token: `stl_` and [`TOKEN_BYTES`] random bytes in hex.
pub(crate) fn generate() -> String {
    let mut bytes = Vec::with_capacity(TOKEN_BYTES);
    while bytes.len() < TOKEN_BYTES {
        bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    bytes.truncate(TOKEN_BYTES);
    format!("stl_{}", hex(&bytes))
}

/// Why a token could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CreateError {
    /// The name is taken (by a live or a revoked token: names are not reused).
    #[error("a token named {0} exists already (revoked names are kept); choose another name")]
    NameTaken(String),
    /// The name is not one the table takes.
    #[error("a token's name is 1 to 64 of a-z, 0-9, '.', '_', '-', and not `env`; {0:?} is not")]
    BadName(String),
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Makes a token named `name` with `role`, recorded as made by `by`;
/// returns the token (shown once: only its digest is kept).
pub(crate) async fn create(conn: &mut PgConnection, name: &str, role: Role, by: &str) -> Result<String, CreateError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name != ENV_TOKEN_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    if !valid {
        return Err(CreateError::BadName(name.to_string()));
    }
    let token = generate();
    let made = sqlx::query(
        "INSERT INTO settlement.api_tokens (name, role, token_sha256, created_by) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(name) // $1
    .bind(role.as_str()) // $2
    .bind(digest(&token)) // $3
    .bind(by) // $4
    .execute(conn)
    .await?;
    if made.rows_affected() == 0 {
        return Err(CreateError::NameTaken(name.to_string()));
    }
    Ok(token)
}

/// A token as listed (never the token).
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub(crate) struct Listed {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Who made it.
    pub created_by: String,
    /// Its last use (to the minute), if any.
    pub last_used_at: Option<DateTime<Utc>>,
    /// When it was revoked (None: it works).
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Every token, oldest first.
pub(crate) async fn list(conn: &mut PgConnection) -> sqlx::Result<Vec<Listed>> {
    sqlx::query_as(
        "SELECT name, role, created_at, created_by, last_used_at, revoked_at FROM settlement.api_tokens
         ORDER BY created_at, name",
    )
    .fetch_all(conn)
    .await
}

/// Revokes token `name`; false when there is no such live token.
pub(crate) async fn revoke(conn: &mut PgConnection, name: &str) -> sqlx::Result<bool> {
    let done =
        sqlx::query("UPDATE settlement.api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL")
            .bind(name) // $1
            .execute(conn)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// The live token whose digest is that of `token`, noting its use (at most
/// once per [`LAST_USE_RESOLUTION_SECS`]; a standby, which cannot write,
/// still answers).
pub(crate) async fn resolve(pool: &sqlx::PgPool, token: &str) -> sqlx::Result<Option<Actor>> {
    let hash = digest(token);
    let found: Option<(String, String, bool)> = sqlx::query_as(
        "SELECT name, role, coalesce(last_used_at < now() - make_interval(secs => $2), true)
         FROM settlement.api_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL",
    )
    .bind(&hash) // $1
    .bind(LAST_USE_RESOLUTION_SECS as f64) // $2
    .fetch_optional(pool)
    .await?;
    let Some((name, role, stale)) = found else {
        return Ok(None);
    };
    if stale {
        let noted = sqlx::query("UPDATE settlement.api_tokens SET last_used_at = now() WHERE token_sha256 = $1")
            .bind(&hash) // $1
            .execute(pool)
            .await;
        if let Err(err) = noted {
            tracing::debug!(error = %err, "a token's last use was not noted");
        }
    }
    Ok(Role::parse(&role).map(|role| Actor { name, role }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_tokens_are_long_random_and_only_their_digest_is_kept() {
        assert!(Role::Viewer < Role::App && Role::App < Role::Operator && Role::Operator < Role::Admin);
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 2 * TOKEN_BYTES);
        assert!(a.starts_with("stl_"));
        assert_eq!(digest(&a).len(), 64);
        assert_ne!(digest(&a), a);
        for r in Role::ALL {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
    }
}
