//! `settled queues`: continuous queues, and the operators' verbs on them.

use std::process::ExitCode;

use anyhow::bail;
use settled_engine::continuous::ReplayFilter;

use crate::cmd::{one_line, DbCommand, Outcome};
use crate::db::Database;
use crate::queues::{self, Cancelled, Found, QueueView, ReplayRequest, DEAD_LETTERS_SHOWN, MAX_DEAD_LETTERS_SHOWN};

/// List continuous queues with their exact state, or act on one.
///
/// Without a verb: one row per registered queue: its table, paused or
/// serving, jobs ready, scheduled, processing and failed (dead letters),
/// and the age of the oldest ready job. A queue whose table is missing, does
/// not conform or cannot be read is listed with the error, and the exit
/// code is 1.
///
/// Each verb says in one line what it changed. Exit 1 when it changed
/// nothing it was asked to (an unknown queue or job, a replay that matches
/// no dead letter, a cancel of a job that has started).
///
/// Under --role-per-command the listings run as settled_readonly and the
/// verbs as settled_api; the application grants those roles its queue
/// tables (SELECT; SELECT, UPDATE).
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    verb: Option<Verb>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `settled queues` verbs.
#[derive(Debug, clap::Subcommand)]
enum Verb {
    /// Pause a queue: its workers claim nothing until it is resumed (jobs
    /// already claimed finish).
    Pause {
        /// The queue.
        name: String,
    },
    /// Resume a paused queue and wake its workers.
    Resume {
        /// The queue.
        name: String,
    },
    /// Cancel a job that has not started (a job a worker holds, or that has
    /// ended, is refused).
    Cancel {
        /// The queue.
        name: String,
        /// The job's key.
        #[arg(long)]
        key: String,
    },
    /// Make dead letters eligible again, with a fresh count of attempts:
    /// one by --key, or every one the filters select (all must hold),
    /// oldest failure first.
    Replay(ReplayArgs),
    /// List a queue's dead letters, newest failure first: key, attempts,
    /// failure time, last error (--json adds the attempt history).
    Dead {
        /// The queue.
        name: String,
        /// How many.
        #[arg(long, default_value_t = DEAD_LETTERS_SHOWN,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_DEAD_LETTERS_SHOWN)))]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The filters of `settled queues replay`.
#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// The queue.
    name: String,
    /// This job only.
    #[arg(long)]
    key: Option<String>,
    /// Jobs whose last error contains this text.
    #[arg(long, value_name = "TEXT")]
    error_contains: Option<String>,
    /// Jobs that failed at or after this time (RFC 3339, e.g. 2026-12-03T10:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = rfc3339("failed_since"))]
    failed_since: Option<String>,
    /// Jobs that failed before this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = rfc3339("failed_before"))]
    failed_before: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = settled_engine::continuous::MAX_BATCH_JOBS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(settled_engine::continuous::MAX_BATCH_JOBS)))]
    limit: u32,
}

/// A clap parser that accepts an RFC 3339 time (clap names the flag).
fn rfc3339(field: &'static str) -> impl Fn(&str) -> Result<String, String> + Clone {
    move |text| {
        queues::parse_time(field, text)
            .map(|_| text.to_string())
            .map_err(|e| e.why)
    }
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_readonly");

    fn connections(&self) -> u32 {
        2
    }

    /// Reading needs `settled_readonly`; the verbs need `settled_api`
    /// (UPDATE of the registry's pause, and of the queue's table, which the
    /// application grants).
    fn role(&self) -> Option<&'static str> {
        match self.verb {
            None | Some(Verb::Dead { .. }) => Some("settled_readonly"),
            Some(_) => Some("settled_api"),
        }
    }

    /// The verbs run in one transaction each, with their audit row (written
    /// only when the verb succeeds: a failed verb changes nothing).
    async fn run(self, db: &Database) -> Outcome {
        let mut tx = db.pool.begin().await?;
        let conn = &mut *tx;
        let (action, target) = match &self.verb {
            None | Some(Verb::Dead { .. }) => (None, String::new()),
            Some(Verb::Pause { name }) => (Some("queues pause"), format!("queue {name}")),
            Some(Verb::Resume { name }) => (Some("queues resume"), format!("queue {name}")),
            Some(Verb::Cancel { name, key }) => (Some("queues cancel"), format!("queue {name} job {key:?}")),
            Some(Verb::Replay(args)) => (Some("queues replay"), format!("queue {}", args.name)),
        };
        let done = match self.verb {
            None => list(conn, self.json).await,
            Some(Verb::Pause { name }) => pause(conn, &name).await,
            Some(Verb::Resume { name }) => resume(conn, &name).await,
            Some(Verb::Cancel { name, key }) => cancel(conn, &name, &key).await,
            Some(Verb::Replay(args)) => replay(conn, args).await,
            Some(Verb::Dead { name, limit, json }) => dead(conn, &name, limit, json).await,
        }?;
        if let Some(action) = action.filter(|_| done == ExitCode::SUCCESS) {
            crate::audit::record_cli(conn, action, &target, crate::audit::OK).await?;
        }
        tx.commit().await?;
        Ok(done)
    }
}

async fn list(conn: &mut sqlx::PgConnection, json: bool) -> Outcome {
    let views = queues::overview(conn).await?;
    let all_readable = views.iter().all(|v| v.error.is_none());
    if json {
        println!("{}", serde_json::to_string_pretty(&views)?);
        return Ok(crate::cmd::exit_code(all_readable));
    }
    if views.is_empty() {
        println!("no continuous queues are registered");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<20}  {:<28}  {:<7}  {:>9}  {:>9}  {:>10}  {:>9}  {:>12}",
        "queue", "table", "state", "ready", "scheduled", "processing", "failed", "oldest ready"
    );
    for view in &views {
        println!("{}", line(view));
    }
    Ok(crate::cmd::exit_code(all_readable))
}

fn line(view: &QueueView) -> String {
    let state = if view.paused { "paused" } else { "serving" };
    let head = format!("{:<20}  {:<28}  {state:<7}", view.name, view.table);
    match (&view.stats, &view.error) {
        (Some(s), _) => {
            let oldest = if s.ready == 0 {
                "-".to_string()
            } else {
                format!("{:.1}s", s.oldest_ready_secs)
            };
            format!(
                "{head}  {:>9}  {:>9}  {:>10}  {:>9}  {oldest:>12}",
                s.ready, s.scheduled, s.processing, s.failed
            )
        }
        (None, error) => format!("{head}  error: {}", error.as_deref().unwrap_or("unknown")),
    }
}

async fn pause(conn: &mut sqlx::PgConnection, name: &str) -> Outcome {
    let found = queues::find(conn, name).await?;
    if found.queue.pause(conn).await? {
        println!("queue {name} paused: its workers claim nothing until `settled queues resume {name}`");
    } else {
        let since = found
            .registered
            .paused_at
            .map(|t| format!(" since {}", t.format("%Y-%m-%d %H:%M:%S UTC")))
            .unwrap_or_default();
        println!("queue {name} was already paused{since}; nothing changed");
    }
    Ok(ExitCode::SUCCESS)
}

async fn resume(conn: &mut sqlx::PgConnection, name: &str) -> Outcome {
    let found = queues::find(conn, name).await?;
    if found.queue.resume(conn).await? {
        println!("queue {name} resumed: its workers were woken");
    } else {
        println!("queue {name} was not paused; nothing changed");
    }
    Ok(ExitCode::SUCCESS)
}

async fn cancel(conn: &mut sqlx::PgConnection, name: &str, key: &str) -> Outcome {
    let found = queues::find_usable(conn, name).await?;
    match queues::cancel(conn, &found, key).await? {
        Cancelled::Now => println!("job {key:?} of queue {name} cancelled: it will not run"),
        Cancelled::NoSuchJob => bail!("queue {name} has no job {key:?}; nothing changed"),
        Cancelled::Refused(why) => bail!("job {key:?} of queue {name} was not cancelled: {why}"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn replay(conn: &mut sqlx::PgConnection, args: ReplayArgs) -> Outcome {
    let request = ReplayRequest {
        key: args.key,
        error_contains: args.error_contains,
        failed_since: args.failed_since,
        failed_before: args.failed_before,
        limit: Some(u64::from(args.limit)),
    };
    let filter = match request.filter() {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!("error: {}", e.named(&e.flag()));
            return Ok(ExitCode::from(2));
        }
    };
    let found = queues::find_usable(conn, &args.name).await?;
    let replayed = queues::replay(conn, &found, &filter).await?;
    say_replayed(&found, &filter, replayed)
}

fn say_replayed(found: &Found, filter: &ReplayFilter, replayed: u64) -> Outcome {
    let (name, which) = (found.name(), queues::describe(filter));
    if replayed == 0 {
        bail!("no dead letter of queue {name} matches ({which}); nothing changed");
    }
    let more = if replayed == u64::from(filter.limit) && filter.key.is_none() {
        format!("; the limit of {} was reached, more may match", filter.limit)
    } else {
        String::new()
    };
    println!(
        "{replayed} dead letter(s) of queue {name} replayed ({which}): eligible again with a fresh count of attempts{more}"
    );
    Ok(ExitCode::SUCCESS)
}

async fn dead(conn: &mut sqlx::PgConnection, name: &str, limit: u32, json: bool) -> Outcome {
    let found = queues::find_usable(conn, name).await?;
    let letters = queues::dead_letters(conn, &found, limit).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&letters)?);
        return Ok(ExitCode::SUCCESS);
    }
    if letters.is_empty() {
        println!("queue {name} has no dead letters");
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<32}  {:>8}  {:<19}  last error", "key", "attempts", "failed (UTC)");
    for d in letters {
        println!(
            "{:<32}  {:>8}  {:<19}  {}",
            d.key,
            d.attempts,
            d.failed_at.format("%Y-%m-%d %H:%M:%S"),
            one_line(d.last_error.as_deref().unwrap_or(""))
        );
    }
    Ok(ExitCode::SUCCESS)
}
