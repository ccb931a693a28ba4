//! `settled tokens`: make, list and revoke the API's named tokens.

use std::process::ExitCode;

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;
use crate::tokens::{self, Role};

/// Make, list and revoke the API's named tokens (viewer, app, operator,
/// admin). A token is printed once, when made; only its SHA-256 is kept.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, clap::Subcommand)]
enum Verb {
    /// Make a token and print it, only it, on stdout: it is not shown again.
    Create {
        /// Its name (1 to 64 of a-z, 0-9, '.', '_', '-'; not `env`).
        #[arg(long)]
        name: String,
        /// What it may do.
        #[arg(long, value_enum)]
        role: Role,
    },
    /// List the tokens: name, role, creation, last use, revocation.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token: every server refuses it from its next request.
    Revoke {
        /// The token's name.
        name: String,
    },
}

impl DbCommand for Args {
    fn role(&self) -> Option<&'static str> {
        match self.verb {
            Verb::List { .. } => Some("settled_readonly"),
            // Making and revoking tokens is the tables' owner's (as migrate).
            _ => None,
        }
    }

    async fn run(self, db: &Database) -> Outcome {
        let mut conn = db.pool.acquire().await?;
        match self.verb {
            Verb::Create { name, role } => {
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                let by = made_by(&mut tx).await?;
                let token = tokens::create(&mut tx, &name, role, &by).await?;
                let target = format!("token {name} role {role}");
                crate::audit::record_cli(&mut tx, "tokens create", &target, crate::audit::OK).await?;
                tx.commit().await?;
                println!("{token}");
            }
            Verb::List { json } => {
                let all = tokens::list(&mut conn).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&all)?);
                } else {
                    println!(
                        "{:<24}  {:<8}  {:<19}  {:<19}  revoked",
                        "name", "role", "created (UTC)", "last used (UTC)"
                    );
                    for t in all {
                        let at = |t: Option<chrono::DateTime<chrono::Utc>>| {
                            t.map_or("-".to_string(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                        };
                        println!(
                            "{:<24}  {:<8}  {:<19}  {:<19}  {}",
                            t.name,
                            t.role,
                            t.created_at.format("%Y-%m-%d %H:%M:%S"),
                            at(t.last_used_at),
                            at(t.revoked_at)
                        );
                    }
                }
            }
            Verb::Revoke { name } => {
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                if !tokens::revoke(&mut tx, &name).await? {
                    eprintln!("error: no live token named {name}");
                    return Ok(ExitCode::FAILURE);
                }
                crate::audit::record_cli(&mut tx, "tokens revoke", &format!("token {name}"), crate::audit::OK).await?;
                tx.commit().await?;
                eprintln!("token {name} revoked");
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Who makes a token: the database login and the OS user.
async fn made_by(conn: &mut sqlx::PgConnection) -> anyhow::Result<String> {
    let login: String = sqlx::query_scalar("SELECT session_user::text").fetch_one(conn).await?;
    let user = std::env::var("USER").unwrap_or_else(|_| "?".to_string());
    Ok(format!("{login} (os user {user})"))
}
