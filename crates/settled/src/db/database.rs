//! An open database: its pool, opened through a single host or a follower of
//! several, its schema made or checked to be this version's before a
//! command runs, and the other pools made like it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use settled_embedded::LocalPostgres;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::connect::{pool_options, start_private, transaction_pooler_seen, with_settings, FromStrChecked};
use super::migrations::denied;
use super::{
    acquire_timeout, migrate, pending_migrations, read_only_reason, redact_url, Access, DbOptions, Pooler, ROLES,
};
use crate::failover::{Follower, Hosts};

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
    pub(crate) async fn open(opts: &DbOptions) -> anyhow::Result<Database> {
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
    pub(crate) async fn another_pool(&self, max_connections: u32, application_name: &str) -> anyhow::Result<PgPool> {
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
    pub(crate) async fn listen_pool(&self) -> anyhow::Result<Option<PgPool>> {
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
    pub(crate) async fn wake(&self) -> anyhow::Result<settled_engine::continuous::Wake> {
        use settled_engine::continuous::Wake;
        Ok(match (self.pooler, self.listen_pool().await?) {
            (_, None) => Wake::Poll,
            (Pooler::Transaction, Some(direct)) => Wake::ListenVia(direct),
            (_, Some(_)) => Wake::Listen,
        })
    }

    /// The private server, when one is in use by this process.
    pub(crate) fn private_server(&self) -> Option<&LocalPostgres> {
        self.server.as_ref()
    }
}
