//! Starting and stopping a private PostgreSQL server.
//!
//! The server listens only on its own Unix socket (no TCP), in a socket
//! directory of its own under the system temp dir, with a free port number
//! naming the socket. As root it runs as the `postgres` OS user, because
//! `initdb` refuses to run as root.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// Where the server programs live.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    /// Directory holding `initdb`, `pg_ctl` and `postgres`.
    pub dir: PathBuf,
}

impl PgBinaries {
    /// Full path of one server program.
    pub fn program(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Finds the server binaries: `$PG_BIN`, then `$PATH`, then the newest
/// `/usr/lib/postgresql/*/bin`.
pub fn find_binaries() -> Result<PgBinaries> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    // An explicit PG_BIN is authoritative: a wrong one is an error, not a hint.
    if let Some(dir) = std::env::var_os("PG_BIN").filter(|v| !v.is_empty()).map(PathBuf::from) {
        return if has_server(&dir) {
            Ok(PgBinaries { dir })
        } else {
            Err(Error::NoBinaries)
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_server(&dir) {
                // A directory of links (e.g. /usr/local/bin -> the version's
                // bin) may hold only some programs: use where pg_ctl really is.
                let dir = fs::canonicalize(dir.join("pg_ctl"))
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                    .filter(|d| has_server(d))
                    .unwrap_or(dir);
                return Ok(PgBinaries { dir });
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, dir)| PgBinaries { dir })
        .ok_or(Error::NoBinaries)
}

/// How to start a private server.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// The project's data directory; the cluster lives in `<data_dir>/pgdata`.
    pub data_dir: PathBuf,
    /// Trade durability for speed (fsync off): for throwaway test servers only.
    pub throwaway: bool,
    /// Remove the data directory when the server stops (test servers).
    pub remove_on_stop: bool,
    /// `max_connections` of the server.
    pub max_connections: u32,
    /// More server settings, `name=value` each (given as `-c name=value`).
    pub settings: Vec<String>,
}

impl LocalOptions {
    /// Durable defaults for a project data directory.
    pub fn durable(data_dir: impl Into<PathBuf>) -> Self {
        LocalOptions {
            data_dir: data_dir.into(),
            throwaway: false,
            remove_on_stop: false,
            max_connections: 300,
            settings: Vec::new(),
        }
    }
}

/// The OS user the server runs as, when it differs from ours.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// A running private server. Stop it with [`LocalPostgres::stop`]; if this
/// process dies first, a watchdog stops it.
#[derive(Debug)]
pub struct LocalPostgres {
    bin: PgBinaries,
    pgdata: PathBuf,
    socket_dir: PathBuf,
    port: u16,
    run_as: Option<RunAs>,
    /// False when we attached to a server another process had started.
    owned: bool,
    remove_on_stop: Option<PathBuf>,
    /// Set when the data directory had to move (the server user could not reach it).
    pub relocated_from: Option<PathBuf>,
}

impl LocalPostgres {
    /// Starts (or attaches to an already running) server for `opts.data_dir`.
    pub fn start(opts: &LocalOptions) -> Result<Self> {
        let bin = find_binaries()?;
        let run_as = server_user()?;
        let (data_dir, relocated_from) = reachable_data_dir(&opts.data_dir, run_as)?;
        let pgdata = data_dir.join("pgdata");

        if let Some((port, socket_dir)) = running_server(&pgdata) {
            return Ok(LocalPostgres {
                bin,
                pgdata,
                socket_dir,
                port,
                run_as,
                owned: false,
                remove_on_stop: None,
                relocated_from,
            });
        }

        if !pgdata.join("PG_VERSION").is_file() {
            init_cluster(&bin, &pgdata, run_as, opts.throwaway)?;
        }
        let port = free_port()?;
        let socket_dir = make_socket_dir(run_as)?;
        let log = data_dir.join("postgres.log");
        let mut settings = vec![
            "-c listen_addresses=''".to_string(),
            format!("-c port={port}"),
            format!("-c unix_socket_directories='{}'", socket_dir.display()),
            format!("-c max_connections={}", opts.max_connections),
            format!("-c shared_buffers={}MB", shared_buffers_mib()),
            // A settlement writes its WAL in one burst: with the default
            // 1 GB, a million creators checkpoint every few seconds, and each
            // checkpoint makes the next writes log full pages again. Durable
            // still: fsync, synchronous_commit and full_page_writes stay on.
            "-c max_wal_size=4GB".to_string(),
            "-c checkpoint_timeout=15min".to_string(),
            "-c wal_buffers=64MB".to_string(),
        ];
        if has_lz4(&bin) {
            settings.push("-c wal_compression=lz4".to_string());
        }
        settings.extend(opts.settings.iter().map(|s| format!("-c {s}")));
        if opts.throwaway {
            settings.extend(
                ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
                    .iter()
                    .map(|s| format!("-c {s}")),
            );
        }
        let mut cmd = Command::new(bin.program("pg_ctl"));
        cmd.arg("start")
            .arg("-D")
            .arg(&pgdata)
            .arg("-w")
            .args(["-t", "60"])
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(settings.join(" "))
            // Its own process group: a Ctrl-C aimed at us must not stop the server under running workers.
            .process_group(0);
        run_program(cmd, run_as, "pg_ctl start").map_err(|err| match err {
            Error::Program { program, output } => Error::Program {
                program,
                output: format!("{output}\n{}", tail_of_file(&log, 20)),
            },
            other => other,
        })?;

        let remove_on_stop = opts.remove_on_stop.then(|| data_dir.clone());
        let server = LocalPostgres {
            bin,
            pgdata,
            socket_dir,
            port,
            run_as,
            owned: true,
            remove_on_stop,
            relocated_from,
        };
        server.spawn_watchdog()?;
        Ok(server)
    }

    /// A connection URL for database `db` on this server (over its socket).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@localhost:{}/{}?host={}",
            self.port,
            db,
            self.socket_dir.display()
        )
    }

    /// The cluster directory (`PGDATA`).
    pub fn pgdata(&self) -> &Path {
        &self.pgdata
    }

    /// The directory holding the server's socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The port number that names the socket.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// True when this process started the server (and so stops it).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// Stops the server with a fast shutdown (sessions are ended, committed
    /// work is kept) and waits for it; a no-op for an attached server.
    pub fn stop(self) -> Result<()> {
        if !self.owned {
            return Ok(());
        }
        let mut cmd = Command::new(self.bin.program("pg_ctl"));
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-m", "fast", "-w", "-t", "60"]);
        let stopped = run_program(cmd, self.run_as, "pg_ctl stop");
        let _ = fs::remove_dir_all(&self.socket_dir);
        if let Some(dir) = &self.remove_on_stop {
            let _ = fs::remove_dir_all(dir);
        }
        stopped
    }

    /// Restarts the server in place (same port and socket): used by chaos
    /// testing to prove workers survive a database restart.
    pub fn restart(&self) -> Result<()> {
        let mut cmd = Command::new(self.bin.program("pg_ctl"));
        let log = self.pgdata.with_file_name("postgres.log");
        cmd.arg("restart")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-m", "fast", "-w", "-t", "60"])
            // Without a log file the new postmaster would hold our output pipes open.
            .arg("-l")
            .arg(&log)
            .process_group(0);
        run_program(cmd, self.run_as, "pg_ctl restart")
    }

    /// Crashes the server: an immediate shutdown, as a power cut looks to
    /// PostgreSQL (no checkpoint; what was not yet in the WAL is gone).
    pub fn crash(&self) -> Result<()> {
        let mut cmd = Command::new(self.bin.program("pg_ctl"));
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-m", "immediate", "-w", "-t", "60"])
            .process_group(0);
        run_program(cmd, self.run_as, "pg_ctl stop -m immediate")
    }

    /// Promotes a standby to primary and waits until it takes writes.
    pub fn promote(&self) -> Result<()> {
        let mut cmd = Command::new(self.bin.program("pg_ctl"));
        cmd.arg("promote")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-w", "-t", "60"])
            .process_group(0);
        run_program(cmd, self.run_as, "pg_ctl promote")
    }

    /// Makes a streaming standby of this server in `<data_dir>/pgdata`
    /// (`pg_basebackup -R`, so it follows this server when started with
    /// [`LocalPostgres::start`] on `data_dir`). Returns the data directory
    /// to start it from (moved like the server's own when the server user
    /// cannot reach `data_dir`).
    pub fn base_backup(&self, data_dir: &Path) -> Result<PathBuf> {
        let (dir, _) = reachable_data_dir(data_dir, self.run_as)?;
        let mut cmd = Command::new(self.bin.program("pg_basebackup"));
        cmd.arg("-D")
            .arg(dir.join("pgdata"))
            .args(["-R", "-X", "stream", "-c", "fast", "-U", "postgres", "-h"])
            .arg(&self.socket_dir)
            .args(["-p", &self.port.to_string()]);
        run_program(cmd, self.run_as, "pg_basebackup")?;
        Ok(dir)
    }

    /// Stops the server but keeps it (data, socket, options): [`restart`]
    /// brings it back, from the options of its last start. An outage, for
    /// tests of what clients do while the database is away.
    ///
    /// [`restart`]: Self::restart
    pub fn take_down(&self) -> Result<()> {
        let mut cmd = Command::new(self.bin.program("pg_ctl"));
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-m", "fast", "-w", "-t", "60"])
            .process_group(0);
        run_program(cmd, self.run_as, "pg_ctl stop")
    }

    /// A detached shell that waits for this process to end, then stops the
    /// server (and removes a throwaway data directory). It covers panics and
    /// SIGKILL; after a clean [`stop`](Self::stop) it finds nothing to do.
    fn spawn_watchdog(&self) -> Result<()> {
        let pg_ctl = self.bin.program("pg_ctl");
        // Only the server this process started: when this process has
        // stopped it and another command has started a new one on the same
        // data directory (two commands run back to back), the new server's
        // postmaster has another pid, and is left alone.
        let postmaster = fs::read_to_string(self.pgdata.join("postmaster.pid"))
            .ok()
            .and_then(|text| text.lines().next().map(|l| l.trim().to_string()))
            .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()) && !pid.is_empty());
        let ours = match &postmaster {
            Some(pid) => format!(
                "[ \"$(head -n 1 '{}/postmaster.pid' 2>/dev/null)\" = '{pid}' ]",
                self.pgdata.display()
            ),
            None => format!("[ -f '{}/postmaster.pid' ]", self.pgdata.display()),
        };
        let mut script = format!(
            "while [ -d /proc/{pid} ]; do sleep 0.5; done; \
             if {ours}; then '{pg_ctl}' stop -D '{pgdata}' -m fast -w -t 60 >/dev/null 2>&1; fi; \
             rm -rf '{sock}'",
            pid = std::process::id(),
            pgdata = self.pgdata.display(),
            pg_ctl = pg_ctl.display(),
            sock = self.socket_dir.display(),
        );
        if let Some(dir) = &self.remove_on_stop {
            script.push_str(&format!("; rm -rf '{}'", dir.display()));
        }
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        if let Some(user) = self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        cmd.spawn().map_err(|e| Error::io("starting the server watchdog", e))?;
        Ok(())
    }
}

/// As root, the `postgres` OS user; otherwise ourselves (None).
fn server_user() -> Result<Option<RunAs>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .ok_or_else(|| Error::Program {
            program: "initdb".into(),
            output: "running as root, and initdb refuses root: create a `postgres` OS user \
                     (the Debian postgresql package does) or run as another user"
                .into(),
        })?;
    Ok(Some(RunAs {
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    }))
}

/// Creates `wanted` for the server user, or, if that user cannot reach it
/// (a root-only home, say), a directory under the system temp dir.
fn reachable_data_dir(wanted: &Path, run_as: Option<RunAs>) -> Result<(PathBuf, Option<PathBuf>)> {
    let absolute = std::path::absolute(wanted).map_err(|e| Error::io(format!("resolving {}", wanted.display()), e))?;
    let Some(user) = run_as else {
        fs::create_dir_all(&absolute).map_err(|e| Error::io(format!("creating {}", absolute.display()), e))?;
        return Ok((absolute, None));
    };
    if prepare_for(&absolute, user).is_ok() && user_can_write(&absolute, user) {
        return Ok((absolute, None));
    }
    let fallback = std::env::temp_dir().join(format!("settled-data-{}", path_tag(&absolute)));
    prepare_for(&fallback, user).map_err(|e| Error::io(format!("creating {}", fallback.display()), e))?;
    if !user_can_write(&fallback, user) {
        return Err(Error::Program {
            program: "settled".into(),
            output: format!(
                "the postgres OS user can reach neither {} nor {}",
                absolute.display(),
                fallback.display()
            ),
        });
    }
    Ok((fallback, Some(absolute)))
}

fn prepare_for(dir: &Path, user: RunAs) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    nix::unistd::chown(
        dir,
        Some(nix::unistd::Uid::from_raw(user.uid)),
        Some(nix::unistd::Gid::from_raw(user.gid)),
    )
    .map_err(std::io::Error::from)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Asks the OS, as that user, rather than guessing from mode bits.
fn user_can_write(dir: &Path, user: RunAs) -> bool {
    Command::new("/bin/sh")
        .arg("-c")
        .arg("test -w \"$1\" && test -x \"$1\"")
        .arg("sh")
        .arg(dir)
        .uid(user.uid)
        .gid(user.gid)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn path_tag(path: &Path) -> String {
    // FNV-1a: a stable short name for a path, not a security boundary.
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in path.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    format!("{hash:016x}")
}

fn init_cluster(bin: &PgBinaries, pgdata: &Path, run_as: Option<RunAs>, throwaway: bool) -> Result<()> {
    let mut cmd = Command::new(bin.program("initdb"));
    cmd.arg("-D")
        .arg(pgdata)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"]);
    if throwaway {
        cmd.arg("--no-sync");
    }
    run_program(cmd, run_as, "initdb")
}

/// The (port, socket dir) of a live server already using `pgdata`, read from
/// its `postmaster.pid` (line 4: port, line 5: socket directory).
fn running_server(pgdata: &Path) -> Option<(u16, PathBuf)> {
    let text = fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let pid: i32 = lines.first()?.trim().parse().ok()?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).ok()?;
    let port = lines.get(3)?.trim().parse().ok()?;
    let socket_dir = PathBuf::from(lines.get(4)?.trim());
    socket_dir
        .join(format!(".s.PGSQL.{port}"))
        .exists()
        .then_some((port, socket_dir))
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("finding a free port", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("finding a free port", e))
}

fn make_socket_dir(run_as: Option<RunAs>) -> Result<PathBuf> {
    let dir = tempfile::Builder::new()
        .prefix("settled-pg-")
        .tempdir_in("/tmp")
        .map_err(|e| Error::io("creating the socket directory", e))?
        .keep();
    if let Some(user) = run_as {
        prepare_for(&dir, user).map_err(|e| Error::io("preparing the socket directory", e))?;
    }
    Ok(dir)
}

fn run_program(mut cmd: Command, run_as: Option<RunAs>, name: &str) -> Result<()> {
    if let Some(user) = run_as {
        cmd.uid(user.uid).gid(user.gid);
    }
    // The server programs must not pick up a caller's PG* settings.
    for var in ["PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGOPTIONS"] {
        cmd.env_remove(var);
    }
    cmd.current_dir("/").stdin(Stdio::null());
    let out = cmd.output().map_err(|e| Error::io(format!("running {name}"), e))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        text.push('\n');
        text.push_str(stdout.trim());
    }
    Err(Error::Program {
        program: name.into(),
        output: text,
    })
}

/// True when the server was built with lz4 (`pg_config --configure`), so
/// `wal_compression = lz4` is a value it takes.
fn has_lz4(bin: &PgBinaries) -> bool {
    Command::new(bin.program("pg_config"))
        .arg("--configure")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("--with-lz4"))
}

fn tail_of_file(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The private server's shared buffers: an eighth of the machine's memory,
/// 256 MiB to 2 GiB. A million-creator period's tables and indexes are
/// about 1 GiB; with the former fixed 256 MiB every backend spent its time
/// evicting (and writing out) the pages the next chunk needed again.
fn shared_buffers_mib() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(2 * 1024 * 1024);
    (total_kib / 1024 / 8).clamp(256, 2048)
}
