//! settled-lab: what measures and attacks the product, kept out of it.
//!
//! The benchmark (`bench/`: strategies as worker processes, the SQL floors,
//! peer job queues, the report and its plots; `bench/continuous/`: job
//! queues side by side on their own workload), the adapter of the public
//! job-queue benchmark (`harness/`), the chaos harness
//! (`chaos/`), the payment provider simulator (`provider_sim/`), and
//! the layers the lab puts around the product's real handlers
//! (`simulate.rs`). Its commands (`cmd/`) are offered by the same `settled`
//! binary; nothing here is reachable from `settled worker`.
//!
//! One deliberate exception to "the product's statements only": the
//! benchmark's `for-update` and `offset` strategies send the engine's claim
//! with its locking clause replaced, to measure what SKIP LOCKED avoids.

pub mod bench;
pub mod chaos;
pub mod cmd;
pub mod harness;
mod histogram_recorder;
pub mod provider_sim;
pub mod simulate;

/// Settles `period` with one `settled worker --period` process of `exe`
/// against `url` (a real worker, as the product runs), its output quiet.
pub(crate) async fn settle_in_a_worker(exe: &std::path::Path, url: &str, period: &str) -> anyhow::Result<()> {
    let status = tokio::process::Command::new(exe)
        .args(["worker", "--period", period])
        .env("DATABASE_URL", url)
        .env("SETTLED_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .await?;
    anyhow::ensure!(status.success(), "settling period {period} failed: {status}");
    Ok(())
}

/// A `settled` process of `exe` on `url`, its warnings logged to `log`,
/// killed on drop; the caller adds its arguments.
pub(crate) fn settled_command(
    exe: &std::path::Path,
    url: &str,
    log: &std::path::Path,
) -> anyhow::Result<tokio::process::Command> {
    let mut command = tokio::process::Command::new(exe);
    command
        .env("DATABASE_URL", url)
        .env("SETTLED_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(std::fs::File::create(log)?))
        .kill_on_drop(true);
    Ok(command)
}
