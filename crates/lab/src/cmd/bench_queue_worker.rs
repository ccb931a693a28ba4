//! `settled bench-queue-worker`: one settled worker process of a
//! `settled bench --continuous` case.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use settled::cmd::{Global, Outcome, Runnable};

/// One worker process of a `settled bench --continuous` case (started by it).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    args: crate::bench::continuous::QueueWorkerArgs,
}

impl Runnable for Args {
    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            let url = global
                .database_url()
                .context("bench-queue-worker needs DATABASE_URL (settled bench sets it)")?;
            let report = crate::bench::continuous::run_queue_worker(&url, self.args).await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        })
    }
}
