//! Where the database comes from: `DATABASE_URL`, or a private PostgreSQL
//! started from the installed server binaries in the project's data directory.
//! Also makes sure the schema is this version's before a command runs: the
//! migrations (engine first, then settlement) are applied when some are
//! missing and the login may apply them, and otherwise checked, with one
//! line saying what to do; a server that takes no writes (a standby) serves
//! the commands that only read.

mod connect;
mod database;
mod migrations;
mod redact;

pub(crate) use connect::with_settings;
pub use database::Database;
pub use migrations::migrate;
pub(crate) use migrations::{pending_migrations, read_only_reason};
pub use redact::redact_url;

use std::path::PathBuf;
use std::time::Duration;

/// Name of the database created on the private server.
pub(crate) const EMBEDDED_DATABASE: &str = "settled";
/// How long to wait for a pooled connection before failing.
pub(crate) const POOL_ACQUIRE_TIMEOUT_SECS: u64 = 30;

/// How long to wait for a connection: `SETTLED_CONNECT_TIMEOUT_SECS`, else
/// [`POOL_ACQUIRE_TIMEOUT_SECS`] (a database that is starting gets that long).
fn acquire_timeout() -> Duration {
    let secs = std::env::var("SETTLED_CONNECT_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| (1..=600).contains(s))
        .unwrap_or(POOL_ACQUIRE_TIMEOUT_SECS);
    Duration::from_secs(secs)
}

/// Where to find or start the database.
#[derive(Debug, Clone)]
pub(crate) struct DbOptions {
    /// An existing server (`DATABASE_URL`); None starts the private server.
    pub url: Option<String>,
    /// Data directory of the private server.
    pub data_dir: PathBuf,
    /// Largest number of pooled connections.
    pub max_connections: u32,
    /// Shown in `pg_stat_activity.application_name` (e.g. `settled-worker`).
    pub application_name: String,
    /// Least-privilege role to `SET ROLE` to on every connection (None: the
    /// login role). With a role, migrations are checked, not applied.
    pub role: Option<&'static str>,
    /// What sits between this process and PostgreSQL.
    pub pooler: Pooler,
    /// A URL without the transaction pooler (migrations, LISTEN).
    pub direct_url: Option<String>,
    /// Whether the command writes (see [`Access`]).
    pub access: Access,
}

/// What a command does with the database, for a server that takes no
/// writes (a hot standby, or `default_transaction_read_only`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Access {
    /// It writes: refused at start on a read-only server, in one line.
    #[default]
    Writes,
    /// It only reads: it works on a standby too.
    Reads,
    /// It serves requests, some of which write: it starts on a read-only
    /// server (its reads work there) and reports itself not ready.
    Serves,
}

/// What sits between settled and PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Pooler {
    /// Nothing, or a proxy that keeps one server connection per client.
    #[default]
    None,
    /// A session pooler: a server connection per client session; nothing changes.
    Session,
    /// A transaction pooler (PgBouncer `pool_mode = transaction`): a server
    /// connection per transaction, so no session state lasts.
    Transaction,
}

/// The least-privilege roles the migrations create.
pub(crate) const ROLES: [&str; 3] = ["settled_worker", "settled_api", "settled_readonly"];
