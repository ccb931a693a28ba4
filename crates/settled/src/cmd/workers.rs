//! `settled workers`.

use crate::cmd::{print_listing, Outcome, ReadOnly};
use crate::db::Database;

/// List worker processes: host, pid, version, heartbeat, alive/stopped/dead.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many.
    #[arg(long, default_value_t = 50)]
    limit: i64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl ReadOnly for Args {
    async fn read(self, db: &Database) -> Outcome {
        let queue = crate::settlement::queue();
        let all = settled_engine::raw::workers::list(&db.pool, Some(&queue), self.limit).await?;
        let header = format!(
            "{:<8}  {:<16}  {:>7}  {:<8}  {:<7}  {:>10}  {:>8}  {:>6}  {:>10}",
            "worker", "host", "pid", "version", "state", "heartbeat", "settled", "held", "rejected"
        );
        print_listing(self.json, &all, &header, |w| {
            format!(
                "{:<8}  {:<16}  {:>7}  {:<8}  {:<7}  {:>9.1}s  {:>8}  {:>6}  {:>10}",
                &w.id.simple().to_string()[..8],
                w.host,
                w.pid,
                w.version,
                w.state,
                w.heartbeat_age_secs,
                w.items_settled,
                w.leases_held,
                w.fence_rejections
            )
        })
    }
}
