//! The work table and the ledger are partitioned by period (migration
//! `20261201000105`). A period's partitions are created ahead, by
//! `ensure`, when it is seeded, imported or started; a row for a period
//! without partitions is refused by PostgreSQL, never parked in a default
//! partition. [`crate::archive`] retires old periods' partitions whole.

use sqlx::PgConnection;

use crate::period::Period;

/// The constraint name the partition function refuses an archived period with.
pub(crate) const PERIOD_ARCHIVED: &str = "period_archived";

/// Creates `period`'s partitions of the work table and the ledger unless
/// they exist (true when it created one). Runs on the caller's transaction:
/// attaching takes SHARE UPDATE EXCLUSIVE on the parents, so workers and
/// readers of other periods go on. Refused for an archived period.
pub(crate) async fn ensure(conn: &mut PgConnection, period: Period) -> anyhow::Result<bool> {
    sqlx::query_scalar("SELECT settlement.ensure_period_partitions($1)")
        .bind(period.date()) // $1
        .fetch_one(conn)
        .await
        .map_err(|e| match e.as_database_error() {
            Some(db) if db.constraint() == Some(PERIOD_ARCHIVED) => anyhow::anyhow!("{}", db.message()),
            _ => anyhow::Error::new(e).context(format!("creating the partitions of period {period}")),
        })
}

/// The partition names of `period` in the work table and the ledger.
pub fn names(period: Period) -> (String, String) {
    let suffix = period.date().format("%Y%m%d");
    (
        format!("token_trade_volume_p{suffix}"),
        format!("reward_ledger_p{suffix}"),
    )
}
