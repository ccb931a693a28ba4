//! Every worker survives a PostgreSQL restart mid-run: it reconnects with
//! backoff (no crash loop) and the period still settles exactly once. This
//! test runs its own server, since it restarts it.

mod common;

use std::process::{Command, Stdio};

use settled_testkit::{LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};

#[tokio::test(flavor = "multi_thread")]
async fn workers_survive_a_postgres_restart_mid_run() {
    let dir = tempfile::Builder::new()
        .prefix("settled-restart-")
        .tempdir()
        .unwrap()
        .keep();
    let opts = LocalOptions {
        data_dir: dir,
        throwaway: true,
        remove_on_stop: true,
        max_connections: 100,
    };
    let server = tokio::task::spawn_blocking(move || LocalPostgres::start(&opts))
        .await
        .unwrap()
        .unwrap();
    let mut admin = PgConnection::connect(&server.url("postgres")).await.unwrap();
    sqlx::query("CREATE DATABASE restart_test")
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    let url = server.url("restart_test");
    let settled = |args: &[&str]| {
        let mut cmd = Command::new(common::SETTLED);
        cmd.args(args)
            .env("DATABASE_URL", &url)
            .env("SETTLED_LOG", "error")
            .stdin(Stdio::null());
        cmd
    };
    assert!(settled(&["seed", "--period", "2026-11-28", "--creators", "2000"])
        .status()
        .unwrap()
        .success());

    for mode in ["tx", "leased"] {
        let period = if mode == "tx" { "2026-11-28" } else { "2026-11-27" };
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
