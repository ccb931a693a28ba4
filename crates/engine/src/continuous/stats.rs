//! A queue's state for operators and metrics: jobs by state from the
//! partial indexes (not a scan of the table's finished history), and the
//! age of the oldest job that could run now.

use sqlx::PgConnection;

use super::{Names, Queue};
use crate::common::error::EngineError;

/// What a queue holds now.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueStats {
    /// Eligible and runnable now.
    pub ready: i64,
    /// Eligible but not before a later time (scheduled, or backing off).
    pub scheduled: i64,
    /// Claimed under a lease.
    pub processing: i64,
    /// Dead letters.
    pub failed: i64,
    /// Seconds since the oldest runnable job could run (0 when none).
    pub oldest_ready_secs: f64,
    /// True while paused.
    pub paused: bool,
}

#[derive(Debug, Clone)]
pub(super) struct Sql {
    stats: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let table = n.table;
        Sql {
            stats: format!(
                "SELECT e.ready, e.scheduled, p.processing, f.failed,
                        coalesce(extract(epoch FROM now() - e.oldest), 0)::float8 AS oldest_ready_secs,
                        coalesce((SELECT q.paused_at IS NOT NULL FROM settled_engine.queues q WHERE q.name = $1), false)
                            AS paused
                 FROM (SELECT count(*) FILTER (WHERE t.not_before <= now()) AS ready,
                              count(*) FILTER (WHERE t.not_before > now()) AS scheduled,
                              min(t.not_before) FILTER (WHERE t.not_before <= now()) AS oldest
                       FROM {table} t WHERE t.status = 'eligible') e,
                      (SELECT count(*) AS processing FROM {table} t WHERE t.status = 'processing') p,
                      (SELECT count(*) AS failed FROM {table} t
                       WHERE t.status IN ('settled', 'failed', 'cancelled') AND t.status = 'failed') f"
            ),
        }
    }
}

impl Queue {
    /// The queue's state now, in one snapshot.
    pub async fn stats(&self, conn: &mut PgConnection) -> Result<QueueStats, EngineError> {
        sqlx::query_as(&self.sql.stats.stats)
            .bind(&self.name) // $1
            .fetch_one(conn)
            .await
            .map_err(EngineError::db("reading a queue's state"))
    }
}
