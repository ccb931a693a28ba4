//! Where the database comes from: `DATABASE_URL`, or a private PostgreSQL
//! started from the installed server binaries in the project's data directory.
//! Also makes sure the schema is this version's before a command runs: the
//! migrations (engine first, then settlement) are applied when some are
//! missing and the login may apply them, and otherwise checked, with one
//! line saying what to do; a server that takes no writes (a standby) serves
//! the commands that only read.

use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use anyhow::Context;
use settled_embedded::{LocalOptions, LocalPostgres};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use crate::failover::{Follower, Hosts};

/// Name of the database created on the private server.
pub const EMBEDDED_DATABASE: &str = "settled";
/// How long to wait for a pooled connection before failing.
pub const POOL_ACQUIRE_TIMEOUT_SECS: u64 = 30;

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
pub struct DbOptions {
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

/// Whether `connect` reaches PostgreSQL through a transaction pooler nobody
/// declared (PgBouncer `pool_mode = transaction`), which would break the
/// session state settled relies on (the migrator's advisory lock, LISTEN,
/// SET ROLE) in ways that only show later. One connection asks for its
/// backend's pid; a second connection opens a transaction and keeps it,
/// so a pooler must give the second one a server connection the first is
/// not using; the first asks again. A direct connection or a session pooler
/// answers the same pid twice; a transaction pooler hands the first
/// connection's next transaction to another server connection. Simple
/// queries only, so no prepared statement is left on a server connection.
/// Says what it saw, or None when it saw nothing (or could not tell: a
/// pool of one server connection, or an error, which opening the pool
/// reports next).
async fn transaction_pooler_seen(connect: &PgConnectOptions) -> Option<String> {
    use sqlx::Row;
    const WAIT: Duration = Duration::from_secs(2);
    async fn pid(conn: &mut PgConnection) -> Option<i32> {
        let row = tokio::time::timeout(WAIT, sqlx::raw_sql("SELECT pg_backend_pid()").fetch_one(&mut *conn))
            .await
            .ok()?
            .ok()?;
        row.try_get::<i32, _>(0).ok()
    }
    let mut first = tokio::time::timeout(WAIT, connect.connect()).await.ok()?.ok()?;
    let before = pid(&mut first).await?;
    let mut second = tokio::time::timeout(WAIT, connect.connect()).await.ok()?.ok()?;
    let held = tokio::time::timeout(WAIT, sqlx::raw_sql("BEGIN").execute(&mut second)).await;
    let after = match held {
        Ok(Ok(_)) => pid(&mut first).await,
        _ => None,
    };
    let _ = tokio::time::timeout(WAIT, second.close()).await;
    let _ = tokio::time::timeout(WAIT, first.close()).await;
    match after {
        Some(after) if after != before => Some(format!(
            "one connection's backend changed from pid {before} to {after} between two transactions"
        )),
        _ => None,
    }
}

/// The least-privilege roles the migrations create.
pub const ROLES: [&str; 3] = ["settled_worker", "settled_api", "settled_readonly"];

/// An open database: a pool, the URL other processes can use, and the
/// private server when this process started it.
pub struct Database {
    /// The connection pool.
    pub pool: PgPool,
    /// A URL for child processes and tools (may hold a password: never log it raw).
    pub url: String,
    connect: PgConnectOptions,
    role: Option<&'static str>,
    /// Follows the primary when `DATABASE_URL` names several hosts.
    follower: Option<Arc<Follower>>,
    server: Option<LocalPostgres>,
    pooler: Pooler,
    direct_url: Option<String>,
}

impl Database {
    /// Connects to `url` and applies migrations.
    pub async fn open_url(url: &str, max_connections: u32, application_name: &str) -> anyhow::Result<Database> {
        Database::open(&DbOptions {
            url: Some(url.to_string()),
            data_dir: PathBuf::new(),
            max_connections,
            application_name: application_name.to_string(),
            role: None,
            pooler: Pooler::None,
            direct_url: None,
            access: Access::Writes,
        })
        .await
    }

    /// Connects (starting the private server if needed) and applies migrations.
    pub async fn open(opts: &DbOptions) -> anyhow::Result<Database> {
        let (url, server) = match &opts.url {
            Some(url) => (url.clone(), None),
            None => {
                let (url, server) = start_private(&opts.data_dir).await?;
                (url, Some(server))
            }
        };
        let (connect, follower) = match Hosts::parse(&url)? {
            None => (
                with_settings(PgConnectOptions::from_str_checked(&url)?, &opts.application_name),
                None,
            ),
            Some(hosts) => {
                let at = hosts.find_within(acquire_timeout(), &opts.application_name).await?;
                tracing::info!(host = %hosts.labels[at], hosts = hosts.labels.len(), "using database host");
                let follower = Follower::new(hosts, at, &opts.application_name);
                (follower.options(&opts.application_name)?, Some(follower))
            }
        };
        let role = opts.role;
        debug_assert!(role.is_none_or(|r| ROLES.contains(&r)));
        let connect = if opts.pooler == Pooler::Transaction {
            anyhow::ensure!(
                role.is_none(),
                "--role-per-command cannot work behind a transaction pooler (its SET ROLE is session state the pooler does not keep): log in as the role instead"
            );
            // Unnamed statements in one round trip (vendor/sqlx-postgres/PATCH.md).
            connect.statement_cache_capacity(0)
        } else {
            connect
        };
        if opts.pooler != Pooler::Transaction && server.is_none() {
            if let Some(seen) = transaction_pooler_seen(&connect).await {
                anyhow::bail!(
                    "{} leads to a transaction pooler ({seen}): set SETTLED_POOLER=transaction, and SETTLED_DIRECT_URL to a URL without the pooler for migrations",
                    redact_url(&url)
                );
            }
        }
        let pool = pool_options(role, opts.pooler, opts.max_connections, follower.clone())
            .connect_with(connect.clone())
            .await
            .with_context(|| format!("connecting to {}", redact_url(&url)))?;
        if let Some(follower) = &follower {
            follower.follow(&pool);
            follower.spawn();
        }
        let db = Database {
            pool,
            url,
            connect,
            role,
            follower,
            server,
            pooler: opts.pooler,
            direct_url: opts.direct_url.clone(),
        };
        db.ensure_migrated(opts).await?;
        Ok(db)
    }

    /// Makes sure the schema is this version's: nothing to do when every
    /// migration is applied (so a login that may not migrate, or a standby,
    /// only checks); otherwise they are applied where this login can apply
    /// them, and refused in one line saying what to do where it cannot. A
    /// command that writes is refused on a read-only server.
    async fn ensure_migrated(&self, opts: &DbOptions) -> anyhow::Result<()> {
        let read_only = read_only_reason(&self.pool).await?;
        if let (Some(reason), Access::Writes) = (read_only, opts.access) {
            anyhow::bail!(
                "this server is read-only (a standby?): {reason}, and this command writes; point DATABASE_URL at the primary"
            );
        }
        let pending = pending_migrations(&self.pool).await.with_context(|| {
            let role = self.role.map(|r| format!(" as role {r}")).unwrap_or_default();
            format!("reading the applied migrations{role}")
        })?;
        if pending.is_empty() {
            if let (Some(reason), Access::Serves) = (read_only, opts.access) {
                tracing::warn!(reason, "this server is read-only (a standby?): reads are served, writes answer 503 and /readyz says not ready");
            }
            return Ok(());
        }
        let pending = pending.describe();
        if let Some(reason) = read_only {
            anyhow::bail!(
                "this server is read-only (a standby?): {reason}, and {pending}; run `settled migrate` on the primary"
            );
        }
        match (self.role, opts.pooler, &opts.direct_url) {
            (Some(role), _, _) => anyhow::bail!(
                "{pending}, which role {role} may not apply; run `settled migrate` with the owner role first"
            ),
            (None, Pooler::Transaction, Some(direct)) => {
                // The migrator holds a session advisory lock: not through the pooler.
                let direct_pool = PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(acquire_timeout())
                    .connect_with(PgConnectOptions::from_str_checked(direct)?.application_name(&opts.application_name))
                    .await
                    .with_context(|| format!("connecting to SETTLED_DIRECT_URL {}", redact_url(direct)))?;
                let migrated = migrate(&direct_pool).await;
                direct_pool.close().await;
                migrated
            }
            (None, Pooler::Transaction, None) => anyhow::bail!(
                "behind a transaction pooler the migrations need a session: set SETTLED_DIRECT_URL (or --direct-url) to a URL that reaches PostgreSQL without the pooler"
            ),
            (None, _, _) => match migrate(&self.pool).await {
                Err(err) => match denied(&err) {
                    Some(refusal) => {
                        let login: String =
                            sqlx::query_scalar("SELECT session_user::text").fetch_one(&self.pool).await?;
                        anyhow::bail!(
                            "{pending}, which login {login} may not apply ({refusal}); run `settled migrate` as the owner of the tables first"
                        )
                    }
                    None => Err(err),
                },
                Ok(()) => Ok(()),
            },
        }
    }

    /// Closes the pool and stops the private server if this process started it.
    pub async fn close(self) -> anyhow::Result<()> {
        self.pool.close().await;
        if let Some(server) = self.server {
            tokio::task::spawn_blocking(move || server.stop())
                .await?
                .context("stopping the private PostgreSQL")?;
        }
        Ok(())
    }

    /// Another pool on the same database, role and settings, of at most
    /// `max_connections` (e.g. `serve`'s pool for costly pages).
    pub async fn another_pool(&self, max_connections: u32, application_name: &str) -> anyhow::Result<PgPool> {
        let connect = match &self.follower {
            Some(follower) => follower.options(application_name)?,
            None => self.connect.clone().application_name(application_name),
        };
        let pool = pool_options(self.role, self.pooler, max_connections, self.follower.clone())
            .connect_with(connect)
            .await
            .with_context(|| format!("connecting to {}", redact_url(&self.url)))?;
        if let Some(follower) = &self.follower {
            follower.follow(&pool);
        }
        Ok(pool)
    }

    /// Where LISTEN can go: None behind a transaction pooler without a
    /// direct URL (poll instead); otherwise a one-connection pool (the
    /// direct URL's, or this database's own options).
    pub async fn listen_pool(&self) -> anyhow::Result<Option<PgPool>> {
        match (self.pooler, &self.direct_url) {
            (Pooler::Transaction, None) => Ok(None),
            (Pooler::Transaction, Some(direct)) => Ok(Some(
                PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(acquire_timeout())
                    .connect_lazy_with(PgConnectOptions::from_str_checked(direct)?.application_name("settled-listen")),
            )),
            _ => Ok(Some(self.pool.clone())),
        }
    }

    /// How a continuous queue's idle loops wake: LISTEN on the pool, on a
    /// direct connection behind a transaction pooler, or polling when there
    /// is none.
    pub async fn wake(&self) -> anyhow::Result<settled_engine::continuous::Wake> {
        use settled_engine::continuous::Wake;
        Ok(match (self.pooler, self.listen_pool().await?) {
            (_, None) => Wake::Poll,
            (Pooler::Transaction, Some(direct)) => Wake::ListenVia(direct),
            (_, Some(_)) => Wake::Listen,
        })
    }

    /// The private server, when one is in use by this process.
    pub fn private_server(&self) -> Option<&LocalPostgres> {
        self.server.as_ref()
    }
}

/// The settings every connection of settled has: its application name, and
/// statements logged at trace level (slow ones, over 5 s, at debug).
pub fn with_settings(options: PgConnectOptions, application_name: &str) -> PgConnectOptions {
    options
        .application_name(application_name)
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Debug, Duration::from_secs(5))
}

/// A pool that takes `role` (a constant of [`ROLES`]) on every connection,
/// plans every statement for its values (on a direct connection: the work
/// table and the ledger are partitioned by period, see
/// [`settled_engine::raw::session`]) and, with a follower, drops connections
/// opened before a failover.
fn pool_options(
    role: Option<&'static str>,
    pooler: Pooler,
    max_connections: u32,
    follower: Option<Arc<Follower>>,
) -> PgPoolOptions {
    PgPoolOptions::new()
        .before_acquire(move |_conn, meta| {
            let fresh = follower.as_ref().is_none_or(|f| f.is_fresh(meta.age));
            Box::pin(async move { Ok(fresh) })
        })
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if let Some(role) = role {
                    // A constant from ROLES, never input.
                    sqlx::query(&format!("SET ROLE {role}")).execute(&mut *conn).await?;
                }
                // Behind a transaction pooler statements go unnamed, planned
                // for their values each time; a SET would outlive this client.
                if pooler != Pooler::Transaction {
                    settled_engine::raw::session::use_custom_plans(conn)
                        .await
                        .map_err(|e| sqlx::Error::Configuration(e.into()))?;
                }
                Ok(())
            })
        })
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout())
}

trait FromStrChecked: Sized {
    fn from_str_checked(url: &str) -> anyhow::Result<Self>;
}

impl FromStrChecked for PgConnectOptions {
    fn from_str_checked(url: &str) -> anyhow::Result<Self> {
        url.parse::<PgConnectOptions>()
            .map_err(|e| anyhow::anyhow!("DATABASE_URL {} is not a PostgreSQL URL: {e}", redact_url(url)))
    }
}

async fn start_private(data_dir: &std::path::Path) -> anyhow::Result<(String, LocalPostgres)> {
    let opts = LocalOptions::durable(data_dir);
    let server = tokio::task::spawn_blocking(move || LocalPostgres::start(&opts)).await??;
    if let Some(wanted) = &server.relocated_from {
        tracing::warn!(
            wanted = %wanted.display(),
            used = %server.pgdata().display(),
            "the postgres OS user cannot reach the data directory; using a directory under the system temp dir"
        );
    }
    let mut admin = PgConnection::connect(&server.url("postgres"))
        .await
        .context("connecting to the private PostgreSQL")?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(EMBEDDED_DATABASE)
        .fetch_one(&mut admin)
        .await?;
    if !exists {
        let created = sqlx::query(&format!("CREATE DATABASE {EMBEDDED_DATABASE}"))
            .execute(&mut admin)
            .await;
        // Another command may have created it at the same moment.
        if let Err(err) = created {
            let duplicate = err
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|c| c == "42P04");
            if !duplicate {
                return Err(err).context("creating the settled database");
            }
        }
    }
    admin.close().await?;
    Ok((server.url(EMBEDDED_DATABASE), server))
}

/// Applies the engine's and the settlement's migrations.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    // The engine's error already says "applying the engine's migrations".
    settled_engine::migrate(pool).await?;
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    migrator.run(pool).await.context("applying the settlement migrations")?;
    Ok(())
}

/// Every embedded migration, the engine's then the settlement's.
fn embedded_migrations() -> Vec<sqlx::migrate::Migration> {
    let settlement = sqlx::migrate!("./migrations");
    let engine = settled_engine::raw::migrator();
    engine.iter().chain(settlement.iter()).cloned().collect()
}

/// The embedded migrations a database does not have as this build has them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PendingMigrations {
    /// Never applied, or failed.
    pub missing: Vec<i64>,
    /// Applied with other text than this build's.
    pub changed: Vec<i64>,
}

impl PendingMigrations {
    /// True when the database has every migration as this build has it.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.changed.is_empty()
    }

    /// What is pending, as a clause of one line.
    pub fn describe(&self) -> String {
        match (self.missing.is_empty(), self.changed.is_empty()) {
            (false, true) => format!(
                "the database lacks migrations this version needs ({})",
                versions(&self.missing)
            ),
            (true, false) => format!(
                "the database has migrations that differ from this version's ({})",
                versions(&self.changed)
            ),
            _ => format!(
                "the database lacks migrations this version needs ({}) and has others that differ from its own ({})",
                versions(&self.missing),
                versions(&self.changed)
            ),
        }
    }
}

/// The embedded migrations the database does not have as this build has
/// them (see [`PendingMigrations`]).
pub async fn pending_migrations(pool: &PgPool) -> Result<PendingMigrations, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('public._sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    let applied: Vec<(i64, Vec<u8>)> = if exists {
        sqlx::query_as("SELECT version, checksum FROM public._sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?
    } else {
        Vec::new()
    };
    let applied: std::collections::HashMap<i64, Vec<u8>> = applied.into_iter().collect();
    let mut pending = PendingMigrations::default();
    for m in embedded_migrations() {
        match applied.get(&m.version) {
            None => pending.missing.push(m.version),
            Some(sum) if sum.as_slice() != &*m.checksum => pending.changed.push(m.version),
            Some(_) => {}
        }
    }
    Ok(pending)
}

/// Why this server takes no writes, if it does not: in recovery (a hot
/// standby), or read-only by default for this session.
pub async fn read_only_reason(pool: &PgPool) -> Result<Option<&'static str>, sqlx::Error> {
    let (in_recovery, read_only): (bool, bool) =
        sqlx::query_as("SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')::bool")
            .fetch_one(pool)
            .await?;
    Ok(if in_recovery {
        Some("it is in recovery")
    } else if read_only {
        Some("default_transaction_read_only is on")
    } else {
        None
    })
}

/// Versions for one line: the first few, and how many more.
fn versions(list: &[i64]) -> String {
    const SHOWN: usize = 3;
    let first: Vec<String> = list.iter().take(SHOWN).map(i64::to_string).collect();
    match list.len() {
        n if n > SHOWN => format!("{} and {} more", first.join(", "), n - SHOWN),
        _ => first.join(", "),
    }
}

/// The database's message when it refused a privilege (SQLSTATE 42501)
/// somewhere in `err`.
fn denied(err: &anyhow::Error) -> Option<String> {
    err.chain().find_map(|cause| {
        let db = cause.downcast_ref::<sqlx::Error>()?.as_database_error()?;
        (db.code()? == "42501").then(|| db.message().to_string())
    })
}

/// A URL fit for logs and errors: the userinfo's password and any
/// `password=` or `sslpassword=` query value become `***`. A password may
/// hold unencoded `/`, `?` or `@`, so the userinfo is taken to end at the
/// last `@` (when in doubt, more is hidden, never less).
pub fn redact_url(url: &str) -> String {
    // A URL the WHATWG parser reads is rewritten by it; libpq also takes
    // URLs it refuses (several hosts, `h1:5432,h2:5432`; unencoded
    // characters in a password), and those are redacted by the rule below.
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.has_host() && !url[url.find("://").map_or(0, |i| i + 3)..].contains(',') {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            if let Some(query) = parsed.query().map(redact_query) {
                parsed.set_query(Some(&query));
            }
            return parsed.to_string();
        }
    }
    redact_by_text(url)
}

/// Redaction without a parser: the userinfo ends at the last `@`, its
/// password at the first `:`; `password` and `sslpassword` in the query.
fn redact_by_text(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let (scheme, rest) = url.split_at(scheme_end);
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let userinfo = userinfo.map(|u| match u.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => u.to_string(),
    });
    let after = match after.split_once('?') {
        Some((path, query)) => format!("{path}?{}", redact_query(query)),
        None => after.to_string(),
    };
    format!("{scheme}{}{after}", userinfo.unwrap_or_default())
}

fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if ["password", "sslpassword"].contains(&key.to_ascii_lowercase().as_str()) => {
                format!("{key}=***")
            }
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_leave_redact_url() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(redact_url("postgres://db/x?host=/tmp"), "postgres://db/x?host=/tmp");
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:19150/x?password=Sup3rS3cret&sslmode=disable"),
            "postgres://postgres@127.0.0.1:19150/x?password=***&sslmode=disable"
        );
        assert_eq!(redact_url("postgres://u:pa/ss@h:5432/x"), "postgres://u:***@h:5432/x");
        assert_eq!(redact_url("postgres://u:p?a@ss@h/x"), "postgres://u:***@h/x");
        assert_eq!(
            redact_url("postgres://u@h/x?PASSWORD=s3"),
            "postgres://u@h/x?PASSWORD=***"
        );
        assert!(!redact_url("postgresql://u:p%40ss@h/d").contains("p%40ss"));
        // libpq's multi-host form, which the URL parser refuses.
        assert_eq!(
            redact_url("postgres://u:pw@h1:5432,h2:5432/db?target_session_attrs=read-write"),
            "postgres://u:***@h1:5432,h2:5432/db?target_session_attrs=read-write"
        );
    }
}
