//! Pointed at a server that takes no writes (a hot standby made with
//! `pg_basebackup -R`, or a primary with `default_transaction_read_only`):
//! the commands that only read work there (the migrations are checked, not
//! applied); the ones that write say in one line that the server is
//! read-only; `serve` starts, answers reads, and `/readyz` says not ready,
//! so an orchestrator sends it no writes.

use crate::common;

use std::process::Stdio;

use common::{free_port, spawn_server, Env, Pair, Server, PERIOD, SETTLED};
use settled_testkit::{LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};

fn options(data_dir: std::path::PathBuf) -> LocalOptions {
    LocalOptions {
        data_dir,
        throwaway: true,
        remove_on_stop: true,
        max_connections: 100,
        settings: Vec::new(),
    }
}

fn settled(url: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(SETTLED);
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env("SETTLED_LOG", "error")
        .stdin(Stdio::null());
    cmd
}

fn run_ok(url: &str, args: &[&str]) -> String {
    common::stdout_of_success(settled(url, args), args)
}

/// Runs a command that must be refused; returns its one line of stderr.
fn refused(url: &str, args: &[&str]) -> String {
    let out = settled(url, args).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "settled {args:?}");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "settled {args:?}: {stderr}");
    stderr
}

/// `settled serve` on `url`, up once /healthz answers.
async fn serve(url: &str, role_per_command: bool) -> Server {
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--bind", bind.as_str()];
    if role_per_command {
        args.insert(0, "--role-per-command");
    }
    let mut cmd = settled(url, &args);
    cmd.env("SETTLED_API_TOKEN", "t");
    spawn_server(cmd, port, "/healthz").await
}

async fn get(url: String) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new().get(url).bearer_auth("t").send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or_default())
}

async fn pay(base: &str, creator: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{base}/v1/payouts"))
        .bearer_auth("t")
        .header("Idempotency-Key", "standby-1")
        .json(&serde_json::json!({ "creator": creator, "amount": "1" }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A primary with a settled period, and a streaming standby of it.
async fn settled_pair() -> (Pair, String) {
    let dir = tempfile::tempdir().unwrap();
    let primary = LocalPostgres::start(&options(dir.path().join("primary"))).expect("start the primary");
    let mut admin = PgConnection::connect(&primary.url("postgres")).await.unwrap();
    sqlx::query("CREATE DATABASE settled")
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    let url = primary.url("settled");
    run_ok(&url, &["seed", "--period", PERIOD, "--creators", "200"]);
    run_ok(&url, &["worker", "--period", PERIOD]);
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let creator: String =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance WHERE balance > 0 ORDER BY creator LIMIT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    conn.close().await.unwrap();
    let standby_dir = primary.base_backup(&dir.path().join("standby")).expect("pg_basebackup");
    let standby = LocalPostgres::start(&options(standby_dir)).expect("start the standby");
    let pair = Pair {
        primary: Some(primary),
        standby: Some(standby),
        _dir: dir,
    };
    (pair, creator)
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_standby_reading_commands_work_writing_ones_say_it_is_read_only_and_readyz_is_503() {
    let (pair, creator) = settled_pair().await;
    let standby = pair.standby.as_ref().unwrap().url("settled");
    let mut conn = PgConnection::connect(&standby).await.unwrap();
    let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(in_recovery);
    conn.close().await.unwrap();

    for args in [
        &["verify", "--period", PERIOD][..],
        &["--role-per-command", "verify", "--period", PERIOD],
    ] {
        let out = run_ok(&standby, args);
        assert!(out.contains("OK, every check holds"), "{out}");
    }
    assert!(run_ok(&standby, &["status", "--period", PERIOD]).contains("settled    200"));
    assert!(run_ok(&standby, &["runs"]).contains("finished"));
    run_ok(&standby, &["workers"]);

    for args in [
        &["seed", "--period", "2026-11-29", "--creators", "5"][..],
        &["worker", "--period", "2026-11-29"],
        &["--role-per-command", "worker"],
        &["migrate"],
    ] {
        let line = refused(&standby, args);
        assert!(
            line.starts_with(
                "error: this server is read-only (a standby?): it is in recovery, and this command writes"
            ),
            "settled {args:?}: {line}"
        );
    }

    let api = serve(&standby, true).await;
    let (status, body) = get(format!("{}/readyz", api.base)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["type"], "/problems/read-only", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("this server is read-only (a standby?)"),
        "{body}"
    );
    let (status, body) = get(format!("{}/v1/creators/{creator}", api.base)).await;
    assert_eq!(status, 200, "reads are served: {body}");
    assert_eq!(pay(&api.base, &creator).await, 503);

    // The primary, for contrast: ready, and it pays.
    let primary = pair.primary.as_ref().unwrap().url("settled");
    let api = serve(&primary, true).await;
    assert_eq!(get(format!("{}/readyz", api.base)).await.0, 200);
    assert_eq!(pay(&api.base, &creator).await, 201);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_default_transaction_read_only_writers_refuse_to_start_and_readyz_is_503() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "20"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    sqlx::query(&format!(
        "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
        env.db.name()
    ))
    .execute(&env.pool)
    .await
    .unwrap();
    let line = refused(&env.db.url, &["seed", "--period", "2026-11-29", "--creators", "5"]);
    assert!(
        line.contains("this server is read-only (a standby?): default_transaction_read_only is on"),
        "{line}"
    );
    let out = run_ok(&env.db.url, &["--role-per-command", "verify", "--period", PERIOD]);
    assert!(out.contains("OK, every check holds"), "{out}");
    let api = serve(&env.db.url, true).await;
    let (status, body) = get(format!("{}/readyz", api.base)).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("default_transaction_read_only is on"),
        "{body}"
    );
}
