//! The audit log (`settlement.audit_log`): who did what, when, to what, and
//! how it ended. Owns writing a row ([`record`], on the caller's
//! transaction, so the row commits or rolls back with the effect it
//! describes), counting a refusal ([`refused`], one row per actor, action
//! and outcome per minute), and reading rows back ([`list`]). The server's
//! requests reach it through `api::audit`; each operator command of the CLI
//! calls [`record`] inside its own transaction. Never: an UPDATE or DELETE
//! of a row (the roles may not), or a token in a row.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Longest actor, action or outcome kept, in characters.
pub(crate) const TEXT_CHARS_MAX: usize = 200;
/// Longest target kept, in characters.
pub(crate) const TARGET_CHARS_MAX: usize = 500;
/// Rows `settled audit` and `/audit` show at most at once.
pub(crate) const ROWS_SHOWN_MAX: i64 = 1000;
/// The outcome of an action that took effect.
pub(crate) const OK: &str = "ok";

/// One thing done, to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Who: a token's name, or `cli:<login>/<os user>`.
    pub actor: String,
    /// What: a route (`POST /v1/holds`) or a command (`queues pause`).
    pub action: String,
    /// To what: a payout, a queue, a period (empty when the action names it).
    pub target: String,
    /// How it ended: [`OK`], or why not (`refused 403`, `failed 409`).
    pub outcome: String,
}

fn cut(text: &str, chars: usize) -> &str {
    text.char_indices().nth(chars).map_or(text, |(at, _)| &text[..at])
}

/// Appends `entry` on `conn`: inside the transaction of its effect, it
/// commits with it or not at all.
pub(crate) async fn record(conn: &mut PgConnection, entry: &Entry) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO settlement.audit_log (actor, action, target, outcome) VALUES ($1, $2, $3, $4)")
        .bind(cut(&entry.actor, TEXT_CHARS_MAX)) // $1
        .bind(cut(&entry.action, TEXT_CHARS_MAX)) // $2
        .bind(cut(&entry.target, TARGET_CHARS_MAX)) // $3
        .bind(cut(&entry.outcome, TEXT_CHARS_MAX)) // $4
        .execute(conn)
        .await?;
    Ok(())
}

/// Counts `count` refusals of `entry`: one row per actor, action and
/// outcome per minute of the database's clock, whose count grows with each
/// repeat.
pub(crate) async fn refused(conn: &mut PgConnection, entry: &Entry, count: i64) -> sqlx::Result<()> {
    sqlx::query("SELECT settlement.audit_refused($1, $2, $3, $4, $5)")
        .bind(cut(&entry.actor, TEXT_CHARS_MAX)) // $1
        .bind(cut(&entry.action, TEXT_CHARS_MAX)) // $2
        .bind(cut(&entry.target, TARGET_CHARS_MAX)) // $3
        .bind(cut(&entry.outcome, TEXT_CHARS_MAX)) // $4
        .bind(count) // $5
        .execute(conn)
        .await?;
    Ok(())
}

/// The CLI's actor: `cli:<login role>/<OS user>` (the login role even
/// under `--role-per-command`, whose SET ROLE does not change it).
pub(crate) async fn cli_actor(conn: &mut PgConnection) -> sqlx::Result<String> {
    let login: String = sqlx::query_scalar("SELECT session_user::text").fetch_one(conn).await?;
    Ok(format!("cli:{login}/{}", os_user()))
}

/// The OS user running this process: its name in the user database, else
/// `$USER`, else `uid <n>`.
fn os_user() -> String {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => std::env::var("USER").unwrap_or_else(|_| format!("uid {uid}")),
    }
}

/// Appends the CLI's `action` on `target` with `outcome`, as
/// [`cli_actor`], on `conn` (the command's transaction).
pub(crate) async fn record_cli(conn: &mut PgConnection, action: &str, target: &str, outcome: &str) -> sqlx::Result<()> {
    let actor = cli_actor(&mut *conn).await?;
    let entry = Entry {
        actor,
        action: action.to_string(),
        target: target.to_string(),
        outcome: outcome.to_string(),
    };
    record(conn, &entry).await
}

/// A row as read back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub(crate) struct Row {
    /// Its place in the log (keyset paging goes by it).
    pub id: i64,
    /// When (the database's clock; a refusal row: its first in the minute).
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// To what.
    pub target: String,
    /// How it ended.
    pub outcome: String,
    /// How many refusals the row stands for (1 for anything else).
    pub count: i64,
}

/// Which rows to read: newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// Only this actor's.
    pub actor: Option<String>,
    /// Only rows at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only rows older than this one (keyset paging: the last id shown).
    pub before_id: Option<i64>,
    /// At most this many (capped at [`ROWS_SHOWN_MAX`]).
    pub limit: i64,
}

/// The rows `filter` selects, newest first.
pub(crate) async fn list(conn: &mut PgConnection, filter: &Filter) -> sqlx::Result<Vec<Row>> {
    sqlx::query_as(
        "SELECT id, at, actor, action, target, outcome, count FROM settlement.audit_log
         WHERE ($1::text IS NULL OR actor = $1) AND ($2::timestamptz IS NULL OR at >= $2)
           AND ($3::bigint IS NULL OR id < $3)
         ORDER BY id DESC LIMIT $4",
    )
    .bind(filter.actor.as_deref()) // $1
    .bind(filter.since) // $2
    .bind(filter.before_id) // $3
    .bind(filter.limit.clamp(1, ROWS_SHOWN_MAX)) // $4
    .fetch_all(conn)
    .await
}

/// Reads `--since` / `since=`: RFC 3339, or a date (midnight UTC).
pub(crate) fn parse_since(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map(|d| d.and_time(chrono::NaiveTime::MIN).and_utc())
        .map_err(|_| format!("since must be an RFC 3339 time or a date (YYYY-MM-DD); {text:?} is neither"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_on_a_character_boundary_and_since_takes_a_time_or_a_date() {
        assert_eq!(cut("abc", 2), "ab");
        assert_eq!(cut("éé", 1), "é");
        assert_eq!(cut("ab", 5), "ab");
        assert_eq!(
            parse_since("2026-12-07").unwrap().to_rfc3339(),
            "2026-12-07T00:00:00+00:00"
        );
        assert!(parse_since("2026-12-07T01:02:03Z").is_ok());
        assert!(parse_since("yesterday").unwrap_err().contains("\"yesterday\""));
    }
}
