//! The chaos's processes: the `settled deliver` fleet the schedule kills and
//! respawns, the `settled serve` servers, and their stop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::clients::API_TOKEN;
use super::{CONFIRM_TTL_SECS, DELIVERERS_KEY_WINDOW, WEBHOOK_SECRET};
use crate::chaos::faults::Fleet;
use crate::chaos::Slot;

/// The `settled deliver` processes.
pub(super) struct Deliverers {
    pub(super) exe: PathBuf,
    pub(super) url: String,
    pub(super) provider_url: String,
    pub(super) lease_ttl_ms: u64,
    pub(super) log_dir: PathBuf,
    pub(super) spawned: usize,
}

impl Fleet for Deliverers {
    fn respawn(&mut self) -> anyhow::Result<tokio::process::Child> {
        self.spawned += 1;
        let log = self.log_dir.join(format!("deliver-{}.log", self.spawned));
        let ttl = self.lease_ttl_ms;
        let mut cmd = crate::settled_command(&self.exe, &self.url, &log)?;
        cmd.args(["deliver", "--provider-url", &self.provider_url])
            // Shorter than the late applies' 1.5 s: their answers are lost.
            .args(["--provider-timeout-ms", "500", "--provider-rate", "2000"])
            .args(["--concurrency", "2", "--batch", "10", "--provider-concurrency", "16"])
            .args(["--lease-ttl-ms", &ttl.to_string()])
            // Retried past the window, a payment is found by its reference;
            // a return whose webhook was lost, by a look-up a second later.
            .args(["--provider-key-window", DELIVERERS_KEY_WINDOW])
            .args(["--returns-poll-every", "1s", "--returns-watch", "1h"])
            .args(["--rescue-interval-ms", &(ttl / 4).max(50).to_string()])
            // A lost webhook is made good by a look-up a second later.
            .args([
                "--poll-after-secs",
                "1",
                "--max-poll-ms",
                "500",
                "--shutdown-grace-ms",
                "1000",
            ]);
        Ok(cmd.spawn()?)
    }

    fn application_name(&self) -> &'static str {
        "settled-deliver"
    }
}

/// A `settled serve` process.
pub(super) struct ApiServer {
    pub(super) child: tokio::process::Child,
    pub(super) base: String,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(super) async fn start_servers(exe: &Path, url: &str, n: u32, log_dir: &Path) -> anyhow::Result<Vec<ApiServer>> {
    let mut servers = Vec::new();
    for i in 0..n {
        let port = free_port()?;
        let child = crate::settled_command(exe, url, &log_dir.join(format!("serve-{i}.log")))?
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .args(["--confirm-ttl-secs", &CONFIRM_TTL_SECS.to_string()])
            .env("SETTLED_API_TOKEN", API_TOKEN)
            .env("SETTLED_PROVIDER_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .spawn()?;
        servers.push(ApiServer {
            child,
            base: format!("http://127.0.0.1:{port}"),
        });
    }
    let http = reqwest::Client::new();
    for server in &servers {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http.get(format!("{}/readyz", server.base)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "settled serve at {} did not come up",
                server.base
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(servers)
}

/// SIGCONT then SIGTERM to every deliverer; killed if still running after
/// a few seconds.
pub(super) async fn stop_deliverers(slots: &mut [Slot]) {
    for slot in slots.iter_mut() {
        let Some(mut child) = slot.child.take() else { continue };
        if let Some(pid) = child.id() {
            let pid = Pid::from_raw(pid as i32);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = kill(pid, Signal::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}
