//! A real PgBouncer (Debian's package) in front of a test database, for the
//! tests of settled behind a pooler. Started on a free 127.0.0.1 port with
//! its own config and log in a temporary directory; stopped on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

/// A running PgBouncer.
pub struct PgBouncer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// The `pgbouncer` program: `$PGBOUNCER`, `$PATH`, or Debian's place.
pub fn find_pgbouncer() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGBOUNCER").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("pgbouncer"));
    on_path
        .chain([PathBuf::from("/usr/sbin/pgbouncer")])
        .find(|p| p.is_file())
}

impl PgBouncer {
    /// Starts PgBouncer in `pool_mode` (`transaction`, `session`) in front of
    /// the server of `database_url`, with at most `pool_size` server
    /// connections per database (fewer than the clients, so they share).
    pub fn start(database_url: &str, pool_mode: &str, pool_size: u32) -> PgBouncer {
        let program =
            find_pgbouncer().expect("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)");
        let target: PgConnectOptions = database_url.parse().expect("a PostgreSQL URL");
        let dir = tempfile::Builder::new().prefix("settled-pgbouncer-").tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = format!(
            "[databases]\n* = host={host} port={pgport} user={user}\n\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = any\npool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n\
             max_client_conn = 1000\nignore_startup_parameters = extra_float_digits\n\
             logfile = {log}\npidfile = {pid}\n",
            host = target
                .get_socket()
                .map_or_else(|| target.get_host().to_string(), |dir| dir.display().to_string()),
            pgport = target.get_port(),
            user = target.get_username(),
            log = dir.path().join("pgbouncer.log").display(),
            pid = dir.path().join("pgbouncer.pid").display(),
        );
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(&ini, config).unwrap();
        let mut cmd = Command::new(program);
        // PgBouncer refuses to run as root: as root, run it as postgres.
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .expect("a postgres OS user");
            nix::unistd::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap();
            nix::unistd::chown(&ini, Some(user.uid), Some(user.gid)).unwrap();
            cmd.arg("-u").arg("postgres");
        }
        let child = cmd
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let bouncer = PgBouncer { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "pgbouncer did not listen: {}", bouncer.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    /// A URL for `database` through this PgBouncer.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
