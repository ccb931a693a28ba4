//! `settled lab-worker`: `settled worker` with the lab's layers around the
//! real handlers (simulated per-item work; leased mode without a provider
//! pays nothing outside). For crash tests, chaos runs and demos of slow work.

use std::time::Duration;

use settled::cmd::{DbCommand, Outcome};
use settled::db::Database;

/// Run `settled worker` with simulated work (lab only).
///
/// Takes every flag of `settled worker`, plus --work-ms: simulated work per
/// creator, inside the transaction in tx mode (after the chunk's writes,
/// before the commit) and outside it in leased mode. In leased mode without
/// --provider-url nothing is paid outside the database.
#[derive(Debug, clap::Args)]
#[group(id = "lab_worker")]
pub struct Args {
    #[command(flatten)]
    worker: settled::cmd::worker::Args,
    /// Simulated work per creator, in milliseconds (at most 60000).
    #[arg(long, default_value_t = 0)]
    work_ms: u64,
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_worker");
    const APPLICATION_NAME: &'static str = "settled-worker";
    const SINGLE_THREADED: bool = true;

    fn connections(&self) -> u32 {
        self.worker.concurrency + 4
    }

    async fn run(self, db: &Database) -> Outcome {
        let e = &self.worker.engine;
        let drainer = crate::simulate::drainer(
            e.mode,
            e.provider_url.as_deref(),
            e.provider_timeout(),
            e.leases(),
            Duration::from_millis(self.work_ms),
        )?;
        self.worker.run_with(db, &drainer).await
    }
}
