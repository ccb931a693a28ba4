//! Helpers shared by the black-box tests: each test gets its own database
//! and drives the real `settled` binary.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

use settled_testkit::TestDb;
use sqlx::PgPool;

mod fixtures;
pub(crate) use fixtures::*;

/// The `settled` binary built for these tests.
pub(crate) const SETTLED: &str = env!("CARGO_BIN_EXE_settled");

/// The end-to-end benches count the server's `settled_bench_%` databases
/// to show nothing is left behind, so they take turns: one bench's live
/// case databases are not another's leftovers.
pub(crate) static ONE_BENCH_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The period most tests settle.
pub(crate) const PERIOD: &str = "2026-11-28";

/// A fresh database with the migrations applied, and a pool on it.
pub(crate) struct Env {
    pub db: TestDb,
    pub pool: PgPool,
}

impl Env {
    pub(crate) async fn new() -> Env {
        // A copy of a database migrated once per test binary.
        let db = TestDb::create_prepared_on_pool("settled", |pool| async move {
            settled::db::migrate(&pool).await.map_err(|e| format!("{e:#}"))?;
            Ok(())
        })
        .await
        .expect("migrated test database");
        Env::on(db).await
    }

    /// A fresh database with no migrations applied.
    pub(crate) async fn unmigrated() -> Env {
        Env::on(TestDb::create().await.expect("test database")).await
    }

    async fn on(db: TestDb) -> Env {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&db.url)
            .await
            .expect("connect");
        Env { db, pool }
    }

    /// A `settled` command bound to this test's database.
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(SETTLED);
        cmd.args(args)
            .env("DATABASE_URL", &self.db.url)
            .env("SETTLED_LOG", "error")
            .stdin(Stdio::null());
        cmd
    }

    /// `settled deliver` paying through `provider`, with the tests' short
    /// leases (1 s), rescue (every 200 ms) and shutdown grace (300 ms), then
    /// `extra` flags; its stdout dropped.
    pub(crate) fn deliver(&self, provider: &str, extra: &[&str]) -> std::process::Child {
        let mut args = vec!["deliver", "--provider-url", provider];
        args.extend_from_slice(SHORT_LEASES);
        args.extend_from_slice(extra);
        self.cmd(&args).stdout(Stdio::null()).spawn().unwrap()
    }

    /// `settled worker` on [`PERIOD`] in leased mode, paying through
    /// `provider`, then `extra` flags, run to success: its stdout.
    pub(crate) fn run_leased_worker(&self, provider: &str, extra: &[&str]) -> String {
        let mut args = vec![
            "worker",
            "--period",
            PERIOD,
            "--mode",
            "leased",
            "--provider-url",
            provider,
        ];
        args.extend_from_slice(extra);
        self.run_ok(&args)
    }

    /// Runs `settled ARGS` to completion.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run settled")
    }

    /// Runs `settled ARGS` and requires exit 0.
    /// Seeds `creators` creators' trade volumes into [`PERIOD`] (`settled
    /// seed`), and returns what it printed.
    pub(crate) fn seed(&self, creators: u64) -> String {
        self.run_ok(&["seed", "--period", PERIOD, "--creators", &creators.to_string()])
    }

    pub(crate) fn run_ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "settled {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub(crate) async fn scalar_i64(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.expect(sql)
    }

    pub(crate) async fn scalar_text(&self, sql: &str) -> String {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.expect(sql)
    }
}

/// A free port on 127.0.0.1.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `settled provider-sim` process and its URL; killed on drop.
pub(crate) struct ProviderSim {
    pub child: std::process::Child,
    pub url: String,
}

impl ProviderSim {
    pub(crate) fn start(extra: &[&str]) -> ProviderSim {
        let port = free_port();
        let mut child = Command::new(SETTLED)
            .args(["provider-sim", "--port", &port.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start provider-sim");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return ProviderSim { child, url };
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("provider-sim did not start");
    }

    /// Points the simulator's webhooks at `server`'s provider-events
    /// endpoint, signed with `secret`.
    pub(crate) async fn post_webhooks_to(&self, server: &Server, secret: &str) {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/webhook-endpoint", self.url))
            .json(&serde_json::json!({ "url": format!("{}/v1/provider-events", server.base), "secret": secret }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }

    pub(crate) async fn counters(&self) -> serde_json::Value {
        reqwest::get(format!("{}/v1/counters", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for ProviderSim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `request`; the answer's JSON body, whatever its status.
pub(crate) async fn json_of<T: serde::de::DeserializeOwned>(request: reqwest::RequestBuilder) -> T {
    request.send().await.unwrap().json().await.unwrap()
}

/// Sends `request`; the answer's status.
pub(crate) async fn status_of(request: reqwest::RequestBuilder) -> reqwest::StatusCode {
    request.send().await.unwrap().status()
}

/// Polls `check` every 50 ms until it is true or `secs` pass.
pub(crate) async fn wait_until<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// `settled lab-worker` on [`PERIOD`]: `concurrency` claim loops, `chunk`
/// items a claim, each taking `work_ms`.
pub(crate) fn lab_worker_args<'a>(concurrency: &'a str, chunk: &'a str, work_ms: &'a str) -> Vec<&'a str> {
    vec![
        "lab-worker",
        "--period",
        PERIOD,
        "--concurrency",
        concurrency,
        "--chunk",
        chunk,
        "--work-ms",
        work_ms,
    ]
}

/// `settled worker` as a daemon that settles each minute's period, one day
/// of catch-up, in UTC.
pub(crate) const MINUTELY_DAEMON: &[&str] = &[
    "worker",
    "--schedule",
    "0 * * * * *",
    "--timezone",
    "UTC",
    "--catch-up-days",
    "1",
];

/// The tests' short leases (1 s), rescue (every 200 ms) and shutdown
/// grace (300 ms).
pub(crate) const SHORT_LEASES: &[&str] = &[
    "--lease-ttl-ms",
    "1000",
    "--rescue-interval-ms",
    "200",
    "--shutdown-grace-ms",
    "300",
];

/// Flags of a leased worker with short timings, for tests.
pub(crate) const LEASED_FAST: &[&str] = &[
    "--mode",
    "leased",
    "--lease-ttl-ms",
    "1000",
    "--rescue-interval-ms",
    "200",
    "--backoff-base-ms",
    "20",
    "--backoff-cap-ms",
    "200",
    "--max-attempts",
    "20",
    "--provider-timeout-ms",
    "300",
    "--shutdown-grace-ms",
    "300",
];

/// POSTs `body` as JSON to `url` with the bearer `token` and, when given,
/// an `Idempotency-Key`; the answer, whatever its status.
pub(crate) async fn post_json(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    key: Option<&str>,
    body: &serde_json::Value,
) -> reqwest::Response {
    let mut request = client.post(url).bearer_auth(token).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request.send().await.unwrap()
}

/// `n` creators (in order) whose balance is at least `amount`; the test
/// fails when there are fewer.
pub(crate) async fn creators_with_balance(env: &Env, n: i64, amount: &str) -> Vec<String> {
    let creators: Vec<String> = sqlx::query_scalar(
        "SELECT creator FROM settlement.creator_balance WHERE balance >= $1::numeric ORDER BY creator LIMIT $2",
    )
    .bind(amount)
    .bind(n)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(creators.len() as i64, n, "creators with enough balance");
    creators
}

/// The names of the checks that failed in a `--json` report of `settled
/// verify`.
pub(crate) fn failed_checks(report: &serde_json::Value) -> Vec<&str> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

/// One payout in all, and `creator`'s balance 1000 below what it was
/// (`before`).
pub(crate) async fn assert_one_payout_of_1000(env: &Env, creator: &str, before: &str) {
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 1);
    let after = env
        .scalar_text(&format!(
            "SELECT balance::text FROM settlement.creator_balance WHERE creator = '{creator}'"
        ))
        .await;
    assert_eq!(after.parse::<u128>().unwrap() + 1000, before.parse::<u128>().unwrap());
}

/// Runs `cmd` (`settled ARGS`), requires exit 0, and returns its stdout.
pub(crate) fn stdout_of_success(mut cmd: Command, args: &[&str]) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "settled {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A `settled deliver` process (from [`Env::deliver`]), killed on drop: a
/// failed test leaves none running.
pub(crate) struct Deliverer(pub(crate) std::process::Child);

impl Deliverer {
    /// SIGTERM, and its clean exit.
    pub(crate) fn stop(mut self) {
        stop(&mut self.0);
    }
}

impl Drop for Deliverer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for a child process, killing it and failing the test after `secs`:
/// a test must end by itself, whatever the code under test does.
/// SIGTERM to `child`, and its clean exit within 30 s.
pub(crate) fn stop(child: &mut std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_bounded(child, 30);
    assert!(status.success(), "exited with {status}");
}

pub(crate) fn wait_bounded(child: &mut std::process::Child, secs: u64) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not end within {secs} s", child.id());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Starts `cmd`, a server listening on 127.0.0.1:`port`, and waits until
/// `path` answers 200.
pub(crate) async fn spawn_server(mut cmd: Command, port: u16, path: &str) -> Server {
    let server = Server {
        child: cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap(),
        base: format!("http://127.0.0.1:{port}"),
    };
    for _ in 0..200 {
        let answer = reqwest::get(format!("{}{path}", server.base)).await;
        if answer.is_ok_and(|r| r.status() == 200) {
            return server;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the server did not come up: {cmd:?}");
}

/// A `settled serve` process on a free port; killed on drop.
pub(crate) struct Server {
    pub child: std::process::Child,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Env {
    /// Starts `settled serve` on this test's database with API token `token`,
    /// under its least-privilege role (`--role-per-command`, so every API
    /// and dashboard test also proves the role's grants suffice), and waits
    /// until /healthz answers.
    pub(crate) async fn serve(&self, token: &str) -> Server {
        self.serve_with(token, &[]).await
    }

    /// As [`Env::serve`], with more arguments for `serve`.
    pub(crate) async fn serve_with(&self, token: &str, extra: &[&str]) -> Server {
        self.spawn_serve(token, true, extra).await
    }

    /// As [`Env::serve_with`], as the login role (no `SET ROLE`).
    pub(crate) async fn serve_as_login(&self, token: &str, extra: &[&str]) -> Server {
        self.spawn_serve(token, false, extra).await
    }

    async fn spawn_serve(&self, token: &str, least_role: bool, extra: &[&str]) -> Server {
        let port = free_port();
        let bind = format!("127.0.0.1:{port}");
        let mut args = vec!["serve", "--bind", &bind];
        if least_role {
            args.insert(0, "--role-per-command");
        }
        args.extend_from_slice(extra);
        let child = self
            .cmd(&args)
            .env("SETTLED_API_TOKEN", token)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if reqwest::get(format!("{}/healthz", server.base))
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                return server;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("settled serve did not come up");
    }
}

/// A private server of the test's own (it is restarted or taken down),
/// with database `db`; returns the server and the database's URL (over the
/// server's socket).
pub(crate) async fn own_server(db: &str) -> (settled_testkit::LocalPostgres, String) {
    let server = start_own_server(db, Vec::new()).await;
    let url = server.url(db);
    (server, url)
}

/// [`own_server`] reached over TCP on 127.0.0.1, as a server on another
/// host is: while it is down, a connection is refused (and a pool keeps
/// trying until its own timeout) instead of finding no socket.
pub(crate) async fn own_tcp_server(db: &str) -> (settled_testkit::LocalPostgres, String) {
    let server = start_own_server(db, vec!["listen_addresses='127.0.0.1'".to_string()]).await;
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", server.port());
    (server, url)
}

async fn start_own_server(db: &str, settings: Vec<String>) -> settled_testkit::LocalPostgres {
    use sqlx::Connection;
    let dir = tempfile::Builder::new()
        .prefix("settled-restart-")
        .tempdir()
        .unwrap()
        .keep();
    let opts = settled_testkit::LocalOptions {
        data_dir: dir,
        throwaway: true,
        remove_on_stop: true,
        max_connections: 100,
        settings,
    };
    let server = tokio::task::spawn_blocking(move || settled_testkit::LocalPostgres::start(&opts))
        .await
        .unwrap()
        .unwrap();
    let mut admin = sqlx::PgConnection::connect(&server.url("postgres")).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    server
}

/// A client that sends `Authorization: Bearer <token>` with every request
/// (a request that sets its own Authorization keeps it): every `/v1` read
/// and dashboard page needs a token.
pub(crate) fn client_with(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().expect("a token fits a header"),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("a client")
}

/// Headless Chromium, as the Debian package installs it (CI installs it).
pub(crate) fn chromium() -> Option<std::path::PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

/// The API token `browse` gives as HTTP Basic's password: serve with it.
pub(crate) const BROWSER_TOKEN: &str = "t0ken";

/// Chromium's `--dump-dom` (or what `args` ask) of `url`, as the operator.
pub(crate) fn browse(browser: &std::path::PathBuf, profile: &std::path::Path, args: &[&str], url: &str) -> String {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,800",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        // Every page needs the token: HTTP Basic's password, in the URL.
        .arg(url.replacen("http://", &format!("http://operator:{BROWSER_TOKEN}@"), 1))
        .stderr(Stdio::null())
        .output()
        .expect("run chromium");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
