//! `settled bench-worker`: one worker of a `settled bench` case.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use settled::cmd::{Global, Outcome, Runnable};

/// One worker of a `settled bench` case (started by `settled bench`).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    args: crate::bench::child::ChildArgs,
}

impl Runnable for Args {
    fn single_threaded(&self) -> bool {
        true
    }

    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            let url = global
                .database_url()
                .context("bench-worker needs DATABASE_URL (settled bench sets it)")?;
            crate::bench::bench_worker(&url, self.args).await?;
            Ok(ExitCode::SUCCESS)
        })
    }
}
