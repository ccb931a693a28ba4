//! settled behind a real PgBouncer (Debian's 1.18) in `pool_mode =
//! transaction`, with fewer server connections than clients, so every
//! transaction may land on another server connection: workers, daemons, API
//! servers, exactly once.

use crate::common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, spawn_server, wait_bounded, Env, Server, PERIOD, SETTLED};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use settled_testkit::{PgBouncer, TestDb};

/// `settled ARGS` through the pooler, in transaction-pooler mode.
fn pooled(url: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(SETTLED);
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env("SETTLED_POOLER", "transaction")
        .env_remove("SETTLED_DIRECT_URL")
        .env("SETTLED_LOG", "info")
        .stdin(Stdio::null());
    cmd
}

fn ok(mut cmd: std::process::Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn bouncer_for(env: &Env, pool_size: u32) -> (PgBouncer, String) {
    let bouncer = PgBouncer::start(&env.db.url, "transaction", pool_size);
    let url = bouncer.url(env.db.name());
    (bouncer, url)
}

#[tokio::test(flavor = "multi_thread")]
async fn migrations_behind_a_transaction_pooler_need_a_direct_url_and_say_so_in_one_line() {
    let fresh = TestDb::create().await.unwrap();
    let bouncer = PgBouncer::start(&fresh.url, "transaction", 4);
    let url = bouncer.url(fresh.name());
    let out = pooled(&url, &["migrate"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("SETTLED_DIRECT_URL"), "{stderr}");
    let mut with_direct = pooled(&url, &["migrate"]);
    with_direct.env("SETTLED_DIRECT_URL", &fresh.url);
    ok(with_direct);
    // Then everything else goes through the pooler.
    ok(pooled(&url, &["seed", "--period", PERIOD, "--creators", "50"]));
    let status = ok(pooled(&url, &["status", "--period", PERIOD]));
    assert!(status.contains("0 of 50 items done"), "{status}");
    // The least-privilege roles are session state: refused, in one line.
    let out = pooled(&url, &["--role-per-command", "status", "--period", PERIOD])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("log in as the role instead"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_pooler_nobody_declared_is_named_at_start_in_one_line() {
    let env = Env::new().await;
    let (_bouncer, url) = bouncer_for(&env, 4);
    ok(pooled(&url, &["seed", "--period", PERIOD, "--creators", "50"]));
    // The same commands with SETTLED_POOLER unset: refused before anything
    // runs, saying what to set.
    for args in [&["status", "--period", PERIOD][..], &["migrate"][..]] {
        let mut undeclared = pooled(&url, args);
        undeclared.env_remove("SETTLED_POOLER");
        let out = undeclared.output().unwrap();
        assert!(
            !out.status.success(),
            "{args:?} succeeded through an undeclared transaction pooler"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].contains("transaction pooler"), "{stderr}");
        assert!(errors[0].contains("SETTLED_POOLER=transaction"), "{stderr}");
    }
    // A session pooler in front of the same database is not mistaken for one.
    let session = PgBouncer::start(&env.db.url, "session", 4);
    let mut through_session = pooled(&session.url(env.db.name()), &["status", "--period", PERIOD]);
    through_session.env("SETTLED_POOLER", "session");
    let status = ok(through_session);
    assert!(status.contains("0 of 50 items done"), "{status}");
    // Nor is a direct connection.
    let direct = env.run_ok(&["status", "--period", PERIOD]);
    assert!(direct.contains("0 of 50 items done"), "{direct}");
}

#[tokio::test(flavor = "multi_thread")]
async fn six_workers_through_pgbouncer_in_transaction_mode_settle_a_period_exactly_once() {
    let env = Env::new().await;
    let (bouncer, url) = bouncer_for(&env, 4);
    ok(pooled(&url, &["seed", "--period", PERIOD, "--creators", "3000"]));
    let mut workers: Vec<Child> = (0..6)
        .map(|_| {
            pooled(
                &url,
                &["worker", "--period", PERIOD, "--concurrency", "4", "--chunk", "50"],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for worker in &mut workers {
        let status = tokio::task::block_in_place(|| wait_bounded(worker, 180));
        let mut log = String::new();
        use std::io::Read;
        worker.stderr.take().unwrap().read_to_string(&mut log).unwrap();
        assert!(status.success(), "worker exited {status:?}:\n{log}\n{}", bouncer.log());
        assert!(!log.contains("prepared statement"), "{log}");
    }
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        3000
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settled_engine.runs WHERE state = 'finished'")
            .await,
        1
    );
    let verified = ok(pooled(&url, &["verify", "--period", PERIOD]));
    assert!(verified.contains("OK"), "{verified}");
}

#[tokio::test(flavor = "multi_thread")]
async fn daemons_through_pgbouncer_start_one_run_per_due_time_and_poll_or_listen_as_they_say() {
    let env = Env::new().await;
    let (bouncer, url) = bouncer_for(&env, 3);
    // An every-minute schedule in UTC: the last due time settles yesterday.
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1))
        .date_naive()
        .to_string();
    ok(pooled(&url, &["seed", "--period", &yesterday, "--creators", "1500"]));
    let logs = tempfile::tempdir().unwrap();
    let mut daemons: Vec<Child> = (0..4)
        .map(|i| {
            let log = std::fs::File::create(logs.path().join(format!("daemon-{i}.log"))).unwrap();
            let mut cmd = pooled(&url, &[common::MINUTELY_DAEMON, &["--max-poll-ms", "500"][..]].concat());
            if i == 0 {
                // One of them has a session for LISTEN.
                cmd.env("SETTLED_DIRECT_URL", &env.db.url);
            }
            cmd.stdout(Stdio::null()).stderr(log).spawn().unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let finished = env
            .scalar_i64(&format!(
                "SELECT count(*) FROM settled_engine.runs WHERE scope = '{yesterday}' AND state = 'finished'"
            ))
            .await;
        if finished == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no finished run: {}", bouncer.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for daemon in &daemons {
        kill(Pid::from_raw(daemon.id() as i32), Signal::SIGTERM).unwrap();
    }
    for (i, daemon) in daemons.iter_mut().enumerate() {
        let status = tokio::task::block_in_place(|| wait_bounded(daemon, 60));
        let log = std::fs::read_to_string(logs.path().join(format!("daemon-{i}.log"))).unwrap();
        assert!(status.success(), "daemon {i} exited {status:?}:\n{log}");
        let said = if i == 0 {
            "notifications: LISTEN (self-test passed)"
        } else {
            "notifications: none (behind a transaction pooler without a direct URL); polling"
        };
        assert!(log.contains(said), "daemon {i} did not say {said:?}:\n{log}");
    }
    assert_eq!(
        env.scalar_i64(&format!(
            "SELECT count(*) FROM settled_engine.runs WHERE scope = '{yesterday}'"
        ))
        .await,
        1
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        1500
    );
}

/// A `settled serve` through the pooler; killed on drop.
async fn serve(url: &str) -> Server {
    let port = free_port();
    let mut cmd = pooled(url, &["serve", "--bind", &format!("127.0.0.1:{port}")]);
    cmd.env("SETTLED_API_TOKEN", "t");
    spawn_server(cmd, port, "/healthz").await
}

async fn post(base: &str, path: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
    let response = common::post_json(&reqwest::Client::new(), &format!("{base}{path}"), "t", key, body).await;
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_api_servers_through_pgbouncer_pay_a_key_once_and_a_hold_refuses_payouts() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "20"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 2")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let (_bouncer, url) = bouncer_for(&env, 4);
    let (a, b) = (serve(&url).await, serve(&url).await);
    let body = json!({ "creator": creators[0], "amount": "777" });
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let base = if i % 2 == 0 { a.base.clone() } else { b.base.clone() };
        let body = body.clone();
        tasks.spawn(async move { post(&base, "/v1/payouts", Some("pooled-key"), &body).await });
    }
    let mut ids = std::collections::HashSet::new();
    while let Some(answer) = tasks.join_next().await {
        let (status, body) = answer.unwrap();
        match status {
            201 => {
                ids.insert(body["id"].as_i64().unwrap());
            }
            409 => assert_eq!(body["type"], "/problems/request-in-progress", "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(ids.len(), 1, "one payout for one key");
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 1);
    // Holds: of 20 racing, one; then payouts of that creator are refused.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let base = if i % 2 == 0 { a.base.clone() } else { b.base.clone() };
        let body = json!({ "creator": creators[1], "reason": "review" });
        tasks.spawn(async move { post(&base, "/v1/holds", None, &body).await.0 });
    }
    let mut created = 0;
    while let Some(status) = tasks.join_next().await {
        match status.unwrap() {
            201 => created += 1,
            409 => {}
            other => panic!("hold answered {other}"),
        }
    }
    assert_eq!(created, 1);
    let (status, refused) = post(
        &b.base,
        "/v1/payouts",
        Some("held-key"),
        &json!({ "creator": creators[1], "amount": "1" }),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["type"], "/problems/creator-on-hold");
}
