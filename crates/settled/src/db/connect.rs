//! How connections are made: the settings every connection has, the pool's
//! options (role, custom plans, a follower's freshness), a transaction
//! pooler nobody declared, and the private server started and its database
//! created.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use settled_embedded::{LocalOptions, LocalPostgres};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection};

use super::{acquire_timeout, redact_url, Pooler, EMBEDDED_DATABASE};
use crate::failover::Follower;

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
pub(super) async fn transaction_pooler_seen(connect: &PgConnectOptions) -> Option<String> {
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

/// The settings every connection of settled has: its application name, and
/// statements logged at trace level (slow ones, over 5 s, at debug).
pub(crate) fn with_settings(options: PgConnectOptions, application_name: &str) -> PgConnectOptions {
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
pub(super) fn pool_options(
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

pub(super) trait FromStrChecked: Sized {
    fn from_str_checked(url: &str) -> anyhow::Result<Self>;
}

impl FromStrChecked for PgConnectOptions {
    fn from_str_checked(url: &str) -> anyhow::Result<Self> {
        url.parse::<PgConnectOptions>()
            .map_err(|e| anyhow::anyhow!("DATABASE_URL {} is not a PostgreSQL URL: {e}", redact_url(url)))
    }
}

pub(super) async fn start_private(data_dir: &std::path::Path) -> anyhow::Result<(String, LocalPostgres)> {
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
