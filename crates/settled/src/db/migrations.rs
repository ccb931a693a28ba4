//! The schema against this build's: the embedded migrations applied, those
//! a database lacks or has with other text, and why a server takes no
//! writes.

use anyhow::Context;
use sqlx::PgPool;

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
pub(crate) struct PendingMigrations {
    /// Never applied, or failed.
    pub missing: Vec<i64>,
    /// Applied with other text than this build's.
    pub changed: Vec<i64>,
}

impl PendingMigrations {
    /// True when the database has every migration as this build has it.
    pub(crate) fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.changed.is_empty()
    }

    /// What is pending, as a clause of one line.
    pub(crate) fn describe(&self) -> String {
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
pub(crate) async fn pending_migrations(pool: &PgPool) -> Result<PendingMigrations, sqlx::Error> {
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
pub(crate) async fn read_only_reason(pool: &PgPool) -> Result<Option<&'static str>, sqlx::Error> {
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
pub(super) fn denied(err: &anyhow::Error) -> Option<String> {
    err.chain().find_map(|cause| {
        let db = cause.downcast_ref::<sqlx::Error>()?.as_database_error()?;
        (db.code()? == "42501").then(|| db.message().to_string())
    })
}
