//! Every worker survives a PostgreSQL restart mid-run: it reconnects with
//! backoff (no crash loop) and the period still settles exactly once. This
//! test runs its own server, since it restarts it.

use crate::common;

use std::process::{Command, Stdio};

use common::{own_server, PERIOD};
use sqlx::{Connection, PgConnection};

/// `settled ARGS` on `url`, logging errors only.
fn settled_on(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(common::SETTLED);
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env("SETTLED_LOG", "error")
        .stdin(Stdio::null());
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_survive_a_postgres_restart_mid_run() {
    let (server, url) = own_server("restart_test").await;
    let settled = |args: &[&str]| settled_on(&url, args);
    assert!(settled(&["seed", "--period", PERIOD, "--creators", "2000"])
        .status()
        .unwrap()
        .success());

    for mode in ["tx", "leased"] {
        let period = if mode == "tx" { PERIOD } else { "2026-11-27" };
        if mode == "leased" {
            assert!(settled(&["seed", "--period", period, "--creators", "2000"])
                .status()
                .unwrap()
                .success());
        }
        let mut workers: Vec<_> = (0..3)
            .map(|_| {
                settled(&[
                    "lab-worker",
                    "--period",
                    period,
                    "--mode",
                    mode,
                    "--chunk",
                    "20",
                    "--work-ms",
                    "5",
                    "--lease-ttl-ms",
                    "3000",
                    "--rescue-interval-ms",
                    "500",
                    "--backoff-base-ms",
                    "50",
                ])
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
            })
            .collect();
        // Let them get going, then restart the server under them.
        let mut conn = PgConnection::connect(&url).await.unwrap();
        loop {
            let paid: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement.reward_ledger WHERE period = $1::date")
                .bind(period)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            if paid >= 200 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        drop(conn);
        tokio::task::block_in_place(|| server.restart()).unwrap();
        for worker in &mut workers {
            let status = common::wait_bounded(worker, 180);
            assert!(
                status.success(),
                "{mode}: a worker did not survive the restart: {status}"
            );
        }
        let out = settled(&["verify", "--period", period]).output().unwrap();
        assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stdout));
    }
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}

/// An idle daemon rides out an outage (the server down for seconds): it
/// logs the outage once and its end once, stays up, and then starts and
/// settles the run that became due while it waited.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_daemon_rides_out_an_outage_then_settles_the_due_run() {
    let (server, url) = own_server("outage_test").await;
    let settled = |args: &[&str]| {
        let mut cmd = Command::new(common::SETTLED);
        cmd.args(args).env("DATABASE_URL", &url).stdin(Stdio::null());
        cmd
    };
    assert!(settled(&["migrate"])
        .env("SETTLED_LOG", "error")
        .status()
        .unwrap()
        .success());
    let log_path = server.pgdata().with_file_name("daemon.log");
    let flags = ["--max-poll-ms", "300", "--max-outage-secs", "120"];
    let mut daemon = settled(&[&["--log-format", "json"][..], common::MINUTELY_DAEMON, &flags[..]].concat())
        .env("SETTLED_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| server.take_down()).unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon exited while the database was away"
    );
    tokio::task::block_in_place(|| server.restart()).unwrap();

    // Input for the period a due time covers (the UTC day before), given
    // only now: the daemon must be the one that starts and settles it.
    let period = (chrono::Utc::now().date_naive() - chrono::Duration::days(1)).to_string();
    assert!(settled(&["seed", "--period", &period, "--creators", "500"])
        .env("SETTLED_LOG", "error")
        .status()
        .unwrap()
        .success());
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let mut state = String::new();
    for _ in 0..600 {
        state = sqlx::query_scalar("SELECT coalesce((SELECT state FROM settled_engine.runs WHERE scope = $1), 'none')")
            .bind(&period)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        if state == "finished" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(state, "finished");
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon must still be running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(common::wait_bounded(&mut daemon, 60).success());
    let out = settled(&["verify", "--period", &period])
        .env("SETTLED_LOG", "error")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));

    // Bounded logs: one line when the outage began, one when it ended.
    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines = |message: &str| log.lines().filter(|l| l.contains(message)).count();
    assert_eq!(lines("database unavailable; retrying with backoff"), 1, "{log}");
    assert_eq!(lines("database reachable again; carrying on"), 1, "{log}");
    drop(conn);
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}

/// The outage limit of the worker that gives up.
const OUTAGE_LIMIT_SECS: u64 = 2;

/// Waits up to `secs` for `child` to exit: its status, or None (it is then
/// killed) when it still ran.
fn exits_within(child: &mut std::process::Child, secs: u64) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_gives_up_after_its_outage_limit_and_another_finishes_the_run_once() {
    give_up_after_the_outage_limit(&[], &["worker"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leased_worker_gives_up_after_its_outage_limit_and_another_finishes_the_run_once() {
    // Four items worked at once, 5 ms each: the run lasts long enough. The
    // leases left behind expire soon, and the finisher's rescuer takes them.
    let leased = [
        "--mode",
        "leased",
        "--lease-ttl-ms",
        "2000",
        "--rescue-interval-ms",
        "500",
    ];
    let finisher = [&["lab-worker"], &leased[..]].concat();
    give_up_after_the_outage_limit(&[&leased[..], &["--provider-concurrency", "4"]].concat(), &finisher).await;
}

/// A worker (with `mode_flags`) whose database stops mid-run exits 1
/// within a few seconds of its outage limit, naming the outage; once the
/// database is back, another (`finisher`) finishes the run, each creator
/// paid once.
async fn give_up_after_the_outage_limit(mode_flags: &[&str], finisher: &[&str]) {
    // Over TCP, as an operator's worker reaches its database.
    let (server, url) = common::own_tcp_server("outage_limit").await;
    let settled = |args: &[&str]| settled_on(&url, args);
    // Enough creators, in small chunks, that the database stops mid-run:
    // each claim loop is in a chunk or about to claim one.
    assert!(settled(&["seed", "--period", PERIOD, "--creators", "20000"])
        .status()
        .unwrap()
        .success());
    let limit = OUTAGE_LIMIT_SECS.to_string();
    let flags = [
        &[
            "lab-worker",
            "--period",
            PERIOD,
            "--chunk",
            "100",
            "--work-ms",
            "5",
            "--max-outage-secs",
            &limit,
        ],
        mode_flags,
    ]
    .concat();
    let mut worker = settled(&flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM settlement.reward_ledger")
        .fetch_one(&mut conn)
        .await
        .unwrap()
        < 100
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(conn);
    // The database goes away for longer than the worker's limit: the
    // worker exits soon after its 2 s, not after a pool's own timeout
    // (30 s) or a wait to record its stop on the database it gave up on.
    let stopped = std::time::Instant::now();
    tokio::task::block_in_place(|| server.take_down()).unwrap();
    let status = tokio::task::block_in_place(|| exits_within(&mut worker, OUTAGE_LIMIT_SECS + 10));
    let mut stderr = String::new();
    use std::io::Read;
    worker.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let Some(status) = status else {
        panic!(
            "the worker with --max-outage-secs {OUTAGE_LIMIT_SECS} still ran {} s after the database stopped:\n{stderr}",
            stopped.elapsed().as_secs()
        );
    };
    eprintln!(
        "{mode_flags:?}: exited {:?} after the database began to stop",
        stopped.elapsed()
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unavailable"), "the error names the outage: {stderr}");
    // Back: another worker finishes the run, every creator paid once.
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let mut finishing = settled(&[finisher, &["--period", PERIOD]].concat())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert!(tokio::task::block_in_place(|| common::wait_bounded(&mut finishing, 120)).success());
    let out = settled(&["verify", "--period", PERIOD]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let paid: i64 = sqlx::query_scalar("SELECT count(DISTINCT creator) FROM settlement.reward_ledger")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(paid, 20000);
    drop(conn);
    tokio::task::block_in_place(|| server.stop()).unwrap();
}
