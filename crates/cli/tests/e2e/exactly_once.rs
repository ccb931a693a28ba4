//! Exactly once under real concurrency: many worker OS processes settle one
//! period; verify holds and there is one ledger row per creator.

use crate::common;

use common::{Env, PERIOD};

#[tokio::test(flavor = "multi_thread")]
async fn eight_worker_processes_settle_20000_creators_exactly_once() {
    let env = Env::new().await;
    env.run_ok(&[
        "seed",
        "--period",
        PERIOD,
        "--creators",
        "20000",
        "--seed",
        "7",
        "--fee-bps",
        "300",
    ]);

    // Eight processes started at once, small chunks so they contend hard.
    let mut children: Vec<_> = (0..8)
        .map(|_| {
            env.cmd(&["worker", "--period", PERIOD, "--concurrency", "3", "--chunk", "25"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for child in &mut children {
        assert!(common::wait_bounded(child, 180).success(), "a worker failed");
    }

    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        20_000
    );
    assert_eq!(
        env.scalar_i64("SELECT count(DISTINCT creator) FROM settlement.reward_ledger")
            .await,
        20_000
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status <> 'settled'")
            .await,
        0
    );
    // Each process settled some: SKIP LOCKED spread the work instead of
    // serializing it (every worker records its count when it stops).
    let workers_with_work = env
        .scalar_i64("SELECT count(*) FROM settled_engine.workers WHERE stopped_at IS NOT NULL AND items_settled > 0")
        .await;
    assert_eq!(workers_with_work, 8);
    let run_state = env.scalar_text("SELECT state FROM settled_engine.runs").await;
    assert_eq!(run_state, "finished");

    let out = env.run(&["verify", "--period", PERIOD, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["ledger_total"], report["expected_total"]);

    // A late worker finds the run finished and changes nothing.
    env.run_ok(&["worker", "--period", PERIOD]);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        20_000
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_needs_a_policy_and_freezes_it() {
    let env = Env::new().await;
    // Loaded by hand: the period's partitions first, as import and seed make them.
    sqlx::raw_sql(
        "SELECT settlement.ensure_period_partitions('2026-11-01');
         INSERT INTO settlement.token_trade_volume (period, creator, volume)
         VALUES ('2026-11-01', '0x00000000000000000000000000000000000000aa', 10000)",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let out = env.run(&["worker", "--period", "2026-11-01"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no settlement policy"), "{stderr}");
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settled_engine.runs").await, 0);

    env.run_ok(&["policy", "--period", "2026-11-01", "--fee-bps", "500"]);
    env.run_ok(&["worker", "--period", "2026-11-01"]);
    assert_eq!(
        env.scalar_text("SELECT amount::text FROM settlement.reward_ledger")
            .await,
        "500"
    );

    let out = env.run(&["policy", "--period", "2026-11-01", "--fee-bps", "900"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("frozen"));
    let out = env.run(&["seed", "--period", "2026-11-01", "--creators", "5"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already has run"));
    env.run_ok(&["verify", "--period", "2026-11-01"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_arguments_are_named() {
    let env = Env::new().await;
    let out = env.run(&["policy", "--period", "2026-13-01", "--fee-bps", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--period"));
    let out = env.run(&["policy", "--period", "2026-11-01", "--fee-bps", "10001"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fee_bps must be 0..=10000"));
    let out = env.run(&["worker", "--period", "2026-11-01", "--chunk", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--chunk"));
}

#[test]
fn without_a_database_or_server_binaries_it_exits_2_with_one_line() {
    let out = std::process::Command::new(common::SETTLED)
        .args(["status", "--period", "2026-11-01"])
        .env_remove("DATABASE_URL")
        .env("PG_BIN", "/nonexistent/postgresql/bin")
        .env("SETTLED_DATA_DIR", std::env::temp_dir().join("settled-no-binaries"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("apt-get install postgresql") && stderr.contains("DATABASE_URL"));
}

#[test]
fn the_database_password_never_appears_in_errors_or_logs() {
    let port = common::free_port();
    let out = std::process::Command::new(common::SETTLED)
        .args(["--log-format", "json", "status", "--period", "2026-11-01"])
        .env(
            "DATABASE_URL",
            format!("postgres://app:topsecret@127.0.0.1:{port}/settled"),
        )
        .env("SETTLED_LOG", "trace")
        .env("SETTLED_CONNECT_TIMEOUT_SECS", "2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("topsecret"), "{stderr}");
    assert!(stderr.contains("app:***@127.0.0.1"), "{stderr}");
    // A password in the query, or one holding an unencoded `/`, is hidden too.
    for url in [
        format!("postgres://app@127.0.0.1:{port}/settled?password=Sup3rS3cret"),
        format!("postgres://app:Sup3r/S3cret@127.0.0.1:{port}/settled"),
    ] {
        let out = std::process::Command::new(common::SETTLED)
            .args(["status", "--period", "2026-11-01"])
            .env("DATABASE_URL", &url)
            .env("SETTLED_LOG", "trace")
            .env("SETTLED_CONNECT_TIMEOUT_SECS", "2")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{url}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("S3cret"), "{url}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line_and_name_the_run_and_scope() {
    let env = Env::new().await;
    env.seed(10);
    let out = env
        .cmd(&["--log-format", "json", "worker", "--period", PERIOD])
        .env("SETTLED_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let working = lines
        .iter()
        .find(|l| l["message"] == "working on run")
        .expect("a 'working on run' line");
    assert_eq!(working["scope"], PERIOD);
    assert!(working["run"].is_number());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_change_racing_a_run_start_never_splits_a_period_between_two_fees() {
    let env = Env::new().await;
    for day in 1..=8 {
        let period = format!("2026-11-{day:02}");
        env.run_ok(&["seed", "--period", &period, "--creators", "300", "--fee-bps", "100"]);
        // Start the run and change the fee at the same moment, from two processes.
        let mut worker = env
            .cmd(&["worker", "--period", &period, "--chunk", "10"])
            .spawn()
            .unwrap();
        let mut policy = env
            .cmd(&["policy", "--period", &period, "--fee-bps", "900"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(common::wait_bounded(&mut worker, 120).success());
        let policy_won = common::wait_bounded(&mut policy, 120).success();
        // Whichever won, every creator was paid at the one fee in force: verify
        // checks each amount against the final policy.
        env.run_ok(&["verify", "--period", &period]);
        let fee: i32 = sqlx::query_scalar("SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1::date")
            .bind(&period)
            .fetch_one(&env.pool)
            .await
            .unwrap();
        assert_eq!(fee, if policy_won { 900 } else { 100 });
    }
}

/// Commands run one right after another on the private PostgreSQL (no
/// `DATABASE_URL`): each starts the server and stops it as it exits, and the
/// watchdog of one must not stop the server the next one just started.
#[test]
fn commands_run_back_to_back_on_the_private_postgres_each_keep_their_server() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::SETTLED)
            .args(args)
            .env_remove("DATABASE_URL")
            .env("SETTLED_DATA_DIR", dir.path().join("data"))
            .env("SETTLED_LOG", "error")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "settled {args:?} after another command: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["seed", "--period", PERIOD, "--creators", "10"]);
    for _ in 0..3 {
        run(&["status", "--period", PERIOD]);
        run(&["runs"]);
    }
}
