//! A real EVM node for the chain rail's tests: Foundry's `anvil`, from the
//! npm package `@foundry-rs/anvil-linux-amd64` that `.ci/run` installs
//! into `tools/chain/node_modules`. Started on a free 127.0.0.1 port with
//! its own state directory, stopped (by its pid) on drop. A test that needs
//! it and cannot find it fails, naming how to install it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable naming the anvil program (`.ci/run` sets it).
pub const ANVIL_VAR: &str = "SETTLED_ANVIL";

/// A running anvil.
pub struct Anvil {
    child: Child,
    port: u16,
    args: Vec<String>,
    dir: tempfile::TempDir,
}

/// The `anvil` program: `$SETTLED_ANVIL`, the repository's
/// `tools/chain/node_modules`, or `$PATH`.
pub fn find_anvil() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(ANVIL_VAR).map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let installed = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/chain/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil");
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("anvil"));
    std::iter::once(installed).chain(on_path).find(|p| p.is_file())
}

/// The `anvil` program, or a panic saying how to install it.
pub fn anvil_program() -> PathBuf {
    find_anvil().unwrap_or_else(|| {
        panic!(
            "anvil is not installed: `npm ci --prefix tools/chain` (.ci/run does it) puts it in \
             tools/chain/node_modules, or set {ANVIL_VAR} to the program"
        )
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Anvil {
    /// Starts anvil with `args` added (`--block-time 1`, say), on 127.0.0.1.
    pub fn start(args: &[&str]) -> Anvil {
        let dir = tempfile::Builder::new().prefix("settled-anvil-").tempdir().unwrap();
        let port = free_port();
        let anvil = Anvil {
            child: spawn_on(port, args, dir.path()),
            port,
            args: args.iter().map(|a| a.to_string()).collect(),
            dir,
        };
        anvil.wait_ready();
        anvil
    }

    /// Its JSON-RPC URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its state directory (for `--dump-state`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops it and starts it again on the same port with `extra` args
    /// added (`--load-state FILE`, say).
    pub fn restart(&mut self, extra: &[&str]) {
        self.stop();
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        self.child = spawn_on(self.port, &args, self.dir.path());
        self.wait_ready();
    }

    /// Kills it (SIGKILL, as a crash: nothing written on the way out) and
    /// starts it again on the same port with its own args; with `--state
    /// FILE`, it comes back from its last periodic dump, without the blocks
    /// mined after it.
    pub fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.child = spawn_on(self.port, &args, self.dir.path());
        self.wait_ready();
    }

    fn stop(&mut self) {
        // SIGTERM first: anvil writes --dump-state on a clean exit.
        crate::terminate(&mut self.child, Duration::from_secs(10));
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "anvil did not listen on port {}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn spawn_on(port: u16, args: &[&str], dir: &std::path::Path) -> Child {
    let log = std::fs::File::create(dir.join("anvil.log")).unwrap();
    Command::new(anvil_program())
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(args)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start anvil")
}

impl Drop for Anvil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
