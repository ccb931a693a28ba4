//! The bench's `settled deliver` and `settled serve` processes: started with
//! their logs, and stopped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::procs::wait_ready;
use super::{PayoutBenchOptions, API_TOKEN};
use crate::settled_command;

/// The processes of the bench, stopped on drop.
pub(super) struct Fleet {
    pub(super) exe: PathBuf,
    pub(super) url: String,
    pub(super) deliverers: Vec<tokio::process::Child>,
    pub(super) servers: Vec<(tokio::process::Child, String)>,
}

impl Fleet {
    pub(super) fn deliver(&mut self, opts: &PayoutBenchOptions, provider: &str, log: &Path) -> anyhow::Result<()> {
        let child = settled_command(&self.exe, &self.url, log)?
            .args(["deliver", "--provider-url", provider])
            // The fleet's limiter far above what is offered: measured is delivery.
            .args(["--provider-rate", "1000000", "--provider-burst", "1000000"])
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args(["--batch", &opts.batch.to_string()])
            .args(["--provider-concurrency", &opts.provider_concurrency.to_string()])
            .args(["--provider-timeout-ms", "30000", "--shutdown-grace-ms", "5000"])
            .stdout(Stdio::piped())
            .spawn()?;
        self.deliverers.push(child);
        Ok(())
    }

    pub(super) async fn serve(&mut self, log: &Path) -> anyhow::Result<String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let base = format!("http://127.0.0.1:{port}");
        let child = settled_command(&self.exe, &self.url, log)?
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .env("SETTLED_API_TOKEN", API_TOKEN)
            .spawn()?;
        self.servers.push((child, base.clone()));
        wait_ready(&base).await?;
        Ok(base)
    }

    /// SIGTERM to the deliverers; their exit lines.
    pub(super) async fn stop_deliverers(&mut self) -> Vec<String> {
        use tokio::io::AsyncReadExt;
        let mut lines = Vec::new();
        for child in &mut self.deliverers {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGTERM);
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                let _ = stdout.read_to_string(&mut out).await;
            }
            lines.push(out.trim().to_string());
        }
        lines
    }
}
