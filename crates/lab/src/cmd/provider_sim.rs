//! `settled provider-sim`.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use settled::cmd::{Global, Outcome, Runnable};

/// Run a local payment provider for tests, demos and chaos runs.
///
/// Stores payments by idempotency key (a repeat returns the first payment
/// and pays nothing more) and injects faults: latency, 503 errors before
/// applying, and "applied, then answered too late". Faults can also be
/// changed while it runs with POST /v1/faults.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Port on 127.0.0.1.
    #[arg(long, default_value_t = 9100)]
    port: u16,
    /// Latency added to every call, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Share of new payments refused with 503 before anything is applied (0..=1).
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Share of new payments applied and then answered too late (0..=1).
    #[arg(long, default_value_t = 0.0)]
    applied_timeout_rate: f64,
    /// How late such an answer comes, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    applied_timeout_ms: u64,
    /// Seed of the fault generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl Runnable for Args {
    fn run(self: Box<Self>, _global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            let faults = crate::provider_sim::Faults {
                latency_ms: self.latency_ms,
                error_rate: self.error_rate,
                applied_timeout_rate: self.applied_timeout_rate,
                applied_timeout_ms: self.applied_timeout_ms,
            };
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
                .await
                .with_context(|| format!("binding 127.0.0.1:{}", self.port))?;
            eprintln!("provider simulator on http://127.0.0.1:{}", self.port);
            crate::provider_sim::serve(listener, faults, self.seed).await?;
            Ok(ExitCode::SUCCESS)
        })
    }
}
