//! What the engine asks of the sessions it runs on.
//!
//! Every engine statement on a work table names its scope, so on a table
//! partitioned by scope one statement needs one partition. PostgreSQL skips
//! the other partitions when it plans a statement for its parameter values
//! (a custom plan). A prepared statement executed often (sqlx prepares and
//! caches each one per connection) may switch to a generic plan, and
//! PostgreSQL 15 locks every partition a generic plan names before execution
//! prunes any: a worker settling today's scope then also locks every older
//! scope's partition, waits behind whoever holds one, and can deadlock with
//! a partition being detached (an archive holds an old partition while it
//! waits for the parent). Custom plans also keep each statement's lock count
//! at one partition's however many scopes the table holds.
//!
//! So on a connection the engine gets from a pool, `plan_cache_mode` should
//! be `force_custom_plan`: run [`use_custom_plans`] from the pool's
//! `after_connect`. Behind a transaction pooler, where statements are sent
//! unnamed (the statement cache disabled), every execution is planned with
//! its values already, and a session setting would leak to the pooler's
//! other clients: leave it out there.
//!
//! The one exception is the engine's own: a chunk statement that names the
//! scope's partition itself (`batch/queue/statement.rs`) can lock nothing else,
//! so its transaction asks for PostgreSQL's default choice of plans
//! (`SET LOCAL`, for that transaction only).

use sqlx::PgConnection;

use crate::common::error::EngineError;

/// The statement [`use_custom_plans`] runs.
pub const USE_CUSTOM_PLANS: &str = "SET plan_cache_mode = force_custom_plan";

/// Makes every plan of this session a custom plan (see the module's text).
pub async fn use_custom_plans(conn: &mut PgConnection) -> Result<(), EngineError> {
    sqlx::query(USE_CUSTOM_PLANS)
        .execute(conn)
        .await
        .map_err(EngineError::db("setting plan_cache_mode"))?;
    Ok(())
}
