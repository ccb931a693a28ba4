//! Operator actions on items, run by the job's lifecycle (`crate::batch::job`):
//! putting failed items back (the attempt, the fence, never goes down),
//! releasing held items, and finding finished runs that have work again.

use sqlx::PgConnection;

use super::{Names, WorkQueue};
use crate::common::error::EngineError;

#[derive(Debug, Clone)]
pub(super) struct Sql {
    retry_failed: String,
    release_held: String,
    finished_with_work: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type, key, key_type) = (n.table, n.scope, n.scope_type, n.key, n.key_type);
        Sql {
            // The attempts so far stop counting toward the limit
            // (attempt_base), while attempt itself keeps growing.
            retry_failed: format!(
                "UPDATE {table}
                 SET status = 'eligible', attempt_base = attempt, not_before = NULL, updated_at = now()
                 WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'failed'
                   AND ($2::text IS NULL OR {key} = CAST($2 AS {key_type}))"
            ),
            release_held: format!(
                "UPDATE {table}
                 SET status = 'eligible', not_before = NULL, updated_at = now()
                 WHERE {key} = CAST($1 AS {key_type}) AND status = 'held'
                 RETURNING {scope}::text"
            ),
            finished_with_work: format!(
                "SELECT r.scope FROM settled_engine.runs r
                 WHERE r.job = $1 AND r.state = 'finished'
                   AND EXISTS (SELECT 1 FROM {table} t
                               WHERE t.{scope} = CAST(r.scope AS {scope_type}) AND t.status = 'eligible')
                 ORDER BY r.scope LIMIT 1"
            ),
        }
    }
}

impl WorkQueue {
    /// Puts `scope`'s failed items (all, or the one with `key`) back to
    /// `eligible`. Returns how many.
    pub(crate) async fn retry_failed(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Option<&str>,
    ) -> Result<u64, EngineError> {
        Ok(sqlx::query(&self.sql.manage.retry_failed)
            .bind(self.scope_arg(scope)?) // $1
            .bind(key) // $2
            .execute(conn)
            .await
            .map_err(EngineError::db("retrying failed items"))?
            .rows_affected())
    }

    /// Makes every held item of `key` eligible again, in any scope. Returns
    /// the scopes (one per item released).
    pub(crate) async fn release_held(&self, conn: &mut PgConnection, key: &str) -> Result<Vec<String>, EngineError> {
        sqlx::query_scalar(&self.sql.manage.release_held)
            .bind(key) // $1
            .fetch_all(conn)
            .await
            .map_err(EngineError::db("releasing held items"))
    }

    /// The oldest scope whose run finished but that has eligible items again.
    pub(crate) async fn finished_scope_with_work(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Option<String>, EngineError> {
        sqlx::query_scalar(&self.sql.manage.finished_with_work)
            .bind(self.job()) // $1
            .fetch_optional(conn)
            .await
            .map_err(EngineError::db("looking for finished runs with work"))
    }
}
