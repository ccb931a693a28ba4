//! Leases: renewing what a worker holds, and giving leases back (a worker
//! stopping, a run cancelled) with the attempt kept, so the fence still
//! refuses the old holder.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::{fetch_items, keys_and_fences, Names, WorkQueue};
use crate::common::error::EngineError;
use crate::common::fence::ROW_FENCE;
use crate::common::item::ClaimedItem;

#[derive(Debug, Clone)]
pub(super) struct Sql {
    renew: String,
    release_own: String,
    release_scope: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type, key, key_type) = (n.table, n.scope, n.scope_type, n.key, n.key_type);
        Sql {
            // One statement per worker per heartbeat, for the leases it knows
            // it holds. A lease whose claim committed but whose answer was
            // lost (the connection dropped) is not renewed: it expires and is
            // rescued. Like every statement on the work table, it names its
            // scope: on a table partitioned by scope it plans, locks and
            // scans that one partition (an archive may hold the others).
            renew: format!(
                "UPDATE {table} t
                 SET lease_until = now() + $3 * interval '1 millisecond'
                 FROM unnest(CAST($4 AS {key_type}[]), CAST($5 AS bigint[])) AS f(key, fence)
                 WHERE t.{scope} = CAST($1 AS {scope_type})
                   AND t.{key} = f.key AND {ROW_FENCE} = f.fence
                   AND t.status = 'processing' AND t.lease_owner = $2
                 RETURNING t.{key}::text AS key, {ROW_FENCE} AS fence"
            ),
            // Graceful shutdown: give back what a worker holds in a scope,
            // attempt kept.
            release_own: format!(
                "UPDATE {table}
                 SET status = 'eligible', lease_owner = NULL, lease_until = NULL, updated_at = now()
                 WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'processing' AND lease_owner = $2
                   AND ($3::{key_type}[] IS NULL OR {key} = ANY($3::{key_type}[]))"
            ),
            // Cancelling a run: every lease of the scope is given back.
            release_scope: format!(
                "UPDATE {table}
                 SET status = 'eligible', lease_owner = NULL, lease_until = NULL, updated_at = now()
                 WHERE {scope} = CAST($1 AS {scope_type}) AND status = 'processing'"
            ),
        }
    }
}

impl WorkQueue {
    /// Extends the leases `worker` holds on these items of `scope` to
    /// `now() + ttl`, in one statement. Returns the items it still holds.
    pub async fn renew_leases(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        worker: Uuid,
        ttl: Duration,
        held: &[ClaimedItem],
    ) -> Result<Vec<ClaimedItem>, EngineError> {
        let (keys, fences) = keys_and_fences(held);
        let query = sqlx::query_as(&self.sql.lease.renew)
            .bind(self.scope_arg(scope)?) // $1
            .bind(worker) // $2
            .bind(ttl.as_millis() as i64) // $3
            .bind(keys) // $4
            .bind(fences); // $5
        fetch_items(query, conn, "renewing leases").await
    }

    /// Gives back leases `worker` holds in `scope` (all of them, or only
    /// `keys`): eligible again at once, attempt kept.
    pub async fn release_leases(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        worker: Uuid,
        keys: Option<&[String]>,
    ) -> Result<u64, EngineError> {
        Ok(sqlx::query(&self.sql.lease.release_own)
            .bind(self.scope_arg(scope)?) // $1
            .bind(worker) // $2
            .bind(keys) // $3
            .execute(conn)
            .await
            .map_err(EngineError::db("releasing leases"))?
            .rows_affected())
    }

    /// Gives back every lease of `scope` (a cancelled run): eligible again,
    /// attempt kept. A worker still working on one is refused at completion.
    pub(crate) async fn release_scope(&self, conn: &mut PgConnection, scope: &str) -> Result<u64, EngineError> {
        Ok(sqlx::query(&self.sql.lease.release_scope)
            .bind(self.scope_arg(scope)?) // $1
            .execute(conn)
            .await
            .map_err(EngineError::db("releasing a scope's leases"))?
            .rows_affected())
    }
}
