//! A primary and its streaming standby (`pg_basebackup -R`), workers
//! connected by a libpq multi-host URL with `target_session_attrs=read-write`;
//! the primary crashes mid-run (`pg_ctl stop -m immediate`) and the standby is
//! promoted. The workers follow the primary to the standby by themselves and
//! finish the run there, every creator paid once, `settled verify` passes.
//! Once with asynchronous and once with synchronous replication.

use crate::common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, spawn_server, wait_bounded, Pair, ProviderSim, Server, LEASED_FAST, PERIOD, SETTLED};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use settled_testkit::{wait_for_true as wait_for, LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};

mod payouts;
mod workers;

const CREATORS: i64 = 6000;

fn options(data_dir: std::path::PathBuf, settings: Vec<String>) -> LocalOptions {
    LocalOptions {
        data_dir,
        // Durable: a crash must lose only what was not in the WAL yet.
        throwaway: false,
        remove_on_stop: true,
        max_connections: 100,
        settings,
    }
}

fn start_pair(synchronous: bool) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let settings = if synchronous {
        vec![
            "synchronous_standby_names='*'".to_string(),
            "synchronous_commit=on".to_string(),
        ]
    } else {
        Vec::new()
    };
    let primary = LocalPostgres::start(&options(dir.path().join("primary"), settings)).expect("start the primary");
    let standby_dir = primary.base_backup(&dir.path().join("standby")).expect("pg_basebackup");
    let standby = LocalPostgres::start(&options(standby_dir, Vec::new())).expect("start the standby");
    Pair {
        primary: Some(primary),
        standby: Some(standby),
        _dir: dir,
    }
}

/// libpq's multi-host form over the two servers' sockets.
fn multi_host_url(pair: &Pair) -> String {
    let (p, s) = (pair.primary.as_ref().unwrap(), pair.standby.as_ref().unwrap());
    format!(
        "postgres://postgres@localhost/settled?host={},{}&port={},{}&target_session_attrs=read-write",
        p.socket_dir().display(),
        s.socket_dir().display(),
        p.port(),
        s.port()
    )
}

fn settled(url: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(SETTLED);
    // The default log filter: what an operator sees.
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env_remove("SETTLED_LOG")
        .stdin(Stdio::null());
    cmd
}

fn run_ok(url: &str, args: &[&str]) -> String {
    common::stdout_of_success(settled(url, args), args)
}

async fn count(url: &str, sql: &str) -> i64 {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
}

/// How the workers pay.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Ledger and item in one transaction.
    InTransaction,
    /// Leases, then the provider simulator, then a fenced completion.
    Leased,
}

/// Creates the `settled` database on the primary (the standby follows).
async fn create_database(pair: &Pair) {
    let mut admin = PgConnection::connect(&pair.primary.as_ref().unwrap().url("postgres"))
        .await
        .unwrap();
    sqlx::query("CREATE DATABASE settled")
        .execute(&mut admin)
        .await
        .unwrap();
}

/// Waits until the standby has replayed all the primary has, then stops its
/// replication: what the primary commits from now on, the standby never gets.
async fn cut_replication(pair: &Pair) {
    let (old_url, new_url) = (
        pair.primary.as_ref().unwrap().url("settled"),
        pair.standby.as_ref().unwrap().url("settled"),
    );
    let mut old = PgConnection::connect(&old_url).await.unwrap();
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut old)
        .await
        .unwrap();
    wait_for(
        &new_url,
        &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
        "the standby to replay what the primary has",
    )
    .await;
    let mut standby = PgConnection::connect(&new_url).await.unwrap();
    for sql in ["ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"] {
        sqlx::query(sql).execute(&mut standby).await.unwrap();
    }
    wait_for(
        &old_url,
        "SELECT count(*) = 0 FROM pg_stat_replication",
        "replication to stop",
    )
    .await;
}

/// Settles 10 creators through `url`, waits until the standby has replayed
/// it all, then stops the standby's replication: what the primary commits
/// from now on, the standby never gets.
async fn settle_then_cut_replication(pair: &Pair, url: &str) -> String {
    create_database(pair).await;
    run_ok(url, &["seed", "--period", PERIOD, "--creators", "10"]);
    run_ok(url, &["worker", "--period", PERIOD]);
    let mut old = PgConnection::connect(&pair.primary.as_ref().unwrap().url("settled"))
        .await
        .unwrap();
    let creator: String =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
            .fetch_one(&mut old)
            .await
            .unwrap();
    drop(old);
    cut_replication(pair).await;
    creator
}

/// `settled serve` on `url` with `extra` flags, once it is ready.
async fn api(url: &str, extra: &[&str]) -> Server {
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--bind", bind.as_str()];
    args.extend_from_slice(extra);
    let mut cmd = settled(url, &args);
    cmd.env("SETTLED_API_TOKEN", "t");
    spawn_server(cmd, port, "/readyz").await
}

async fn pay(base: &str, key: &str, creator: &str) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/payouts"))
        .bearer_auth("t")
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({ "creator": creator, "amount": "1000" }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// Crashes the primary, promotes the standby, and waits until `api` takes
/// writes again.
async fn fail_over(pair: &mut Pair, api: &Server) {
    pair.primary.take().unwrap().crash().unwrap();
    pair.standby.as_ref().unwrap().promote().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{}/readyz", api.base))
        .await
        .map(|r| r.status().as_u16())
        .ok()
        != Some(200)
    {
        assert!(Instant::now() < deadline, "serve did not follow the failover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
