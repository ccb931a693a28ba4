//! `settled audit`: the audit log, newest first.

use crate::audit::{self, Filter};
use crate::cmd::{print_listing, Outcome, ReadOnly};
use crate::db::Database;

/// Rows shown unless --limit says otherwise.
pub(crate) const DEFAULT_LIMIT: i64 = 100;

/// Print the audit log, newest first: who did what, to what, and how it
/// ended (the API's and the dashboard's writes, their refusals, counted per
/// minute, and the CLI's operator commands).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this actor's rows (a token's name, `anonymous`, `cli:LOGIN/USER`).
    #[arg(long)]
    actor: Option<String>,
    /// Only rows at or after this time (RFC 3339, or YYYY-MM-DD for midnight UTC).
    #[arg(long, value_parser = audit::parse_since)]
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// At most this many rows.
    #[arg(long, default_value_t = DEFAULT_LIMIT, value_parser = clap::value_parser!(i64).range(1..=audit::ROWS_SHOWN_MAX))]
    limit: i64,
    /// Print a JSON array of objects with `at`, `actor`, `action`,
    /// `target`, `outcome` and `count`.
    #[arg(long)]
    json: bool,
}

impl ReadOnly for Args {
    async fn read(self, db: &Database) -> Outcome {
        let filter = Filter {
            actor: self.actor,
            since: self.since,
            before_id: None,
            limit: self.limit,
        };
        let rows = audit::list(&mut *db.pool.acquire().await?, &filter).await?;
        let header = format!(
            "{:<19}  {:<24}  {:<40}  {:<30}  {:>5}  outcome",
            "at (UTC)", "actor", "action", "target", "count"
        );
        print_listing(self.json, &rows, &header, |r| {
            format!(
                "{:<19}  {:<24}  {:<40}  {:<30}  {:>5}  {}",
                r.at.format("%Y-%m-%d %H:%M:%S"),
                r.actor,
                r.action,
                r.target,
                r.count,
                r.outcome
            )
        })
    }
}
