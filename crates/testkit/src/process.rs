//! Ending a child process the tests started.

use std::process::Child;
use std::time::{Duration, Instant};

/// SIGTERM to `child`, then up to `grace` for it to exit by itself (a clean
/// exit lets it write what it writes on the way out); past that, SIGKILL.
/// Either way the child is reaped.
pub fn terminate(child: &mut Child, grace: Duration) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
