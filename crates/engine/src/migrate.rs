//! The engine's embedded migrations (schema `settled_engine`).
//!
//! Applications keep their own migrations in their own schema; both share
//! sqlx's bookkeeping table, so each migrator ignores the other's versions.

use sqlx::migrate::Migrator;
use sqlx::PgPool;

use crate::common::error::EngineError;

/// The engine's migrations, as embedded in this build.
pub fn migrator() -> Migrator {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    migrator
}

/// Applies the engine's migrations. Safe to call from many processes at once:
/// sqlx serializes migrators with an advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<(), EngineError> {
    migrator().run(pool).await?;
    Ok(())
}
