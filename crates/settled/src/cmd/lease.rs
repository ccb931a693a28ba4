//! `settled lease acquire|release`.

use std::process::ExitCode;
use std::time::Duration;

use settled_engine::once::named_lease::{release_fenced, Lease};

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;

/// Named leases with fencing tokens (for scripts and operators).
///
/// `acquire` takes a named lease for --ttl-ms on the database clock and
/// prints its fence (exit 1 while someone else holds it); with --hold-ms it
/// keeps it that long, then releases it. `release` gives it back if the
/// fence still holds (exit 1 when it was lost: a stale holder is refused).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

/// `settled lease` actions.
#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Acquire a lease; print `{"name", "holder", "fence"}`.
    Acquire {
        /// The lease's name.
        #[arg(long)]
        name: String,
        /// Time to live in milliseconds.
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
        ttl_ms: u64,
        /// Who holds it (default: host:pid).
        #[arg(long)]
        holder: Option<String>,
        /// Keep it this long, then release it, in milliseconds.
        #[arg(long)]
        hold_ms: Option<u64>,
    },
    /// Release a lease held with this fence.
    Release {
        /// The lease's name.
        #[arg(long)]
        name: String,
        /// The fence it was acquired with.
        #[arg(long)]
        fence: i64,
    },
}

impl DbCommand for Args {
    async fn run(self, db: &Database) -> Outcome {
        let pool = &db.pool;
        match self.action {
            Action::Acquire {
                name,
                ttl_ms,
                holder,
                hold_ms,
            } => {
                let holder = holder.unwrap_or_else(default_holder);
                let Some(lease) = Lease::acquire(pool, &name, &holder, Duration::from_millis(ttl_ms)).await? else {
                    eprintln!("lease {name:?} is held by someone else");
                    return Ok(ExitCode::from(1));
                };
                println!("{}", serde_json::to_string(&lease)?);
                if let Some(ms) = hold_ms {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    if !lease.release(pool).await? {
                        eprintln!("lease {name:?} was lost before its release (fence {})", lease.fence);
                        return Ok(ExitCode::from(1));
                    }
                }
            }
            Action::Release { name, fence } => {
                if !release_fenced(pool, &name, fence).await? {
                    eprintln!("lease {name:?} is not held with fence {fence}: refused");
                    return Ok(ExitCode::from(1));
                }
                println!("lease {name:?} released");
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

fn default_holder() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    format!("{host}:{}", std::process::id())
}
