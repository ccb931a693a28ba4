//! Runs and schedules with real processes and the real clock: one run per
//! period however many daemons wake at once, catch-up, a dead starter, two
//! periods due at once, cancel and resume.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use common::{wait_until, Env, PERIOD};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A daily UTC schedule (6 fields, seconds first) firing at `at`'s time of day.
fn daily_at(at: DateTime<Utc>) -> String {
    format!("{} {} {} * * *", at.second(), at.minute(), at.hour())
}

async fn db_now(env: &Env) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()").fetch_one(&env.pool).await.unwrap()
}

fn daemon(env: &Env, schedule: &str, extra: &[&str]) -> std::process::Child {
    let mut args = vec![
        "lab-worker",
        "--schedule",
        schedule,
        "--timezone",
        "UTC",
        "--catch-up-days",
        "3",
        "--max-poll-ms",
        "500",
    ];
    args.extend_from_slice(extra);
    env.cmd(&args).stdout(Stdio::null()).spawn().expect("spawn daemon")
}

fn stop_all(children: &mut [std::process::Child]) {
    for child in children.iter() {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    }
    for child in children.iter_mut() {
        let status = common::wait_bounded(child, 180);
        assert!(status.success(), "a daemon did not stop cleanly: {status}");
    }
}

async fn finished_runs(env: &Env) -> i64 {
    env.scalar_i64("SELECT count(*) FROM settled_engine.runs WHERE state = 'finished'")
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_daemons_waking_at_once_create_one_run_and_all_work_in_it() {
    let env = Env::new().await;
    let fire = db_now(&env).await + chrono::Duration::seconds(6);
    let period = (fire.date_naive() - chrono::Duration::days(1)).to_string();
    env.run_ok(&["seed", "--period", &period, "--creators", "6000"]);
    let schedule = daily_at(fire);
    let mut daemons: Vec<_> = (0..20)
        .map(|_| {
            daemon(
                &env,
                &schedule,
                &["--concurrency", "1", "--chunk", "10", "--work-ms", "3"],
            )
        })
        .collect();
    wait_until(120, "the run to finish", || async { finished_runs(&env).await == 1 }).await;
    stop_all(&mut daemons);

    assert_eq!(env.scalar_i64("SELECT count(*) FROM settled_engine.runs").await, 1);
    let starter_is_a_daemon = env
        .scalar_i64("SELECT count(*) FROM settled_engine.runs r JOIN settled_engine.workers w ON w.id = r.started_by")
        .await;
    assert_eq!(starter_is_a_daemon, 1, "the starter must be one of the daemons");
    let busy = env
        .scalar_i64("SELECT count(*) FROM settled_engine.workers WHERE items_settled > 0")
        .await;
    assert_eq!(busy, 20, "every daemon should have claimed work in the one run");
    env.run_ok(&["verify", "--period", &period]);
    let runs = env.run_ok(&["runs"]);
    assert!(runs.contains("finished") && runs.contains("settled 6000"), "{runs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_worker_after_a_missed_due_time_creates_the_missed_run() {
    let env = Env::new().await;
    // Due 30 s ago, and no worker was up.
    let fire = db_now(&env).await - chrono::Duration::seconds(30);
    let period = (fire.date_naive() - chrono::Duration::days(1)).to_string();
    env.run_ok(&["seed", "--period", &period, "--creators", "500"]);
    let mut late = vec![daemon(&env, &daily_at(fire), &[])];
    wait_until(60, "the missed run to finish", || async {
        finished_runs(&env).await == 1
    })
    .await;
    stop_all(&mut late);
    let run_period = env.scalar_text("SELECT scope FROM settled_engine.runs").await;
    assert_eq!(run_period, period);
    env.run_ok(&["verify", "--period", &period]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_starter_killed_right_after_creating_the_run_leaves_nothing_stuck() {
    let env = Env::new().await;
    let fire = db_now(&env).await + chrono::Duration::seconds(3);
    let period = (fire.date_naive() - chrono::Duration::days(1)).to_string();
    env.run_ok(&["seed", "--period", &period, "--creators", "3000"]);
    let schedule = daily_at(fire);
    let mut starter = daemon(&env, &schedule, &["--work-ms", "5", "--chunk", "10"]);
    wait_until(30, "the run to exist", || async {
        env.scalar_i64("SELECT count(*) FROM settled_engine.runs").await == 1
    })
    .await;
    kill(Pid::from_raw(starter.id() as i32), Signal::SIGKILL).unwrap();
    common::wait_bounded(&mut starter, 180);
    let starter_id = env
        .scalar_text("SELECT started_by::text FROM settled_engine.runs")
        .await;

    let mut others: Vec<_> = (0..2).map(|_| daemon(&env, &schedule, &[])).collect();
    wait_until(60, "the others to finish the run", || async {
        finished_runs(&env).await == 1
    })
    .await;
    stop_all(&mut others);
    let finisher = env
        .scalar_text("SELECT finished_by::text FROM settled_engine.runs")
        .await;
    assert_ne!(finisher, starter_id, "a surviving worker must finish the run");
    env.run_ok(&["verify", "--period", &period]);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_periods_due_at_once_run_one_after_the_other() {
    let env = Env::new().await;
    // Due 10 s ago today and yesterday: two periods are due at once.
    let fire = db_now(&env).await - chrono::Duration::seconds(10);
    let newer = (fire.date_naive() - chrono::Duration::days(1)).to_string();
    let older = (fire.date_naive() - chrono::Duration::days(2)).to_string();
    env.run_ok(&["seed", "--period", &newer, "--creators", "1500"]);
    env.run_ok(&["seed", "--period", &older, "--creators", "1500"]);
    let schedule = daily_at(fire);
    let mut daemons: Vec<_> = (0..2).map(|_| daemon(&env, &schedule, &["--work-ms", "1"])).collect();
    wait_until(90, "both runs to finish", || async { finished_runs(&env).await == 2 }).await;
    stop_all(&mut daemons);

    let (older_finished, newer_started): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT (SELECT finished_at FROM settled_engine.runs WHERE scope = $1),
                (SELECT started_at FROM settled_engine.runs WHERE scope = $2)",
    )
    .bind(&older)
    .bind(&newer)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(older_finished <= newer_started, "the older period runs first, alone");
    env.run_ok(&["verify", "--period", &older]);
    env.run_ok(&["verify", "--period", &newer]);

    // `settled run` on a finished period says so and changes nothing.
    let ledger_before = env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await;
    let out = env.run_ok(&["run", "--period", &newer]);
    assert!(out.contains("is finished; nothing changed"), "{out}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        ledger_before
    );
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settled_engine.runs").await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_claims_and_gives_back_leases_then_run_resumes() {
    let env = Env::new().await;
    env.seed(400);
    let out = env.run_ok(&["run", "--period", PERIOD]);
    assert!(out.contains("started run"), "{out}");
    let mut args = vec![
        "lab-worker",
        "--period",
        PERIOD,
        "--chunk",
        "10",
        "--work-ms",
        "100",
        // One item at a time: the run takes about 40 s, so the cancel below
        // lands before its end however slowly the machine starts it.
        "--concurrency",
        "1",
        "--provider-concurrency",
        "1",
    ];
    args.extend_from_slice(common::LEASED_FAST);
    let mut worker = env.cmd(&args).stdout(Stdio::null()).spawn().unwrap();
    wait_until(30, "leases to be held", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'processing'")
            .await
            > 0
    })
    .await;
    let out = env.run_ok(&["run", "--period", PERIOD, "--cancel"]);
    assert!(out.contains("cancelled"), "{out}");
    assert!(common::wait_bounded(&mut worker, 180).success());
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'processing'")
            .await,
        0
    );
    let left = env
        .scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'eligible'")
        .await;
    assert!(left > 0, "the cancel should have stopped the run before the end");
    assert_eq!(
        env.scalar_text("SELECT state FROM settled_engine.runs").await,
        "cancelled"
    );

    let out = env.run_ok(&["run", "--period", PERIOD, "--wait"]);
    assert!(out.contains("resumed") && out.contains("finished"), "{out}");
    env.run_ok(&["verify", "--period", PERIOD]);
    let workers = env.run_ok(&["workers", "--json"]);
    let list: serde_json::Value = serde_json::from_str(&workers).unwrap();
    assert!(
        list.as_array().unwrap().iter().all(|w| w["state"] == "stopped"),
        "{list:#}"
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_draining_at_once_finish_the_run_once_with_one_report() {
    let env = Env::new().await;
    env.seed(2000);
    env.run_ok(&["worker", "--period", PERIOD, "--chunk", "500"]);
    // Everything is settled; put the run back to running, as if its last
    // chunks had just committed on every worker at the same moment.
    sqlx::query(
        "UPDATE settled_engine.runs SET state = 'running', finished_at = NULL, finished_by = NULL, report = NULL",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let run_id = env.scalar_i64("SELECT id FROM settled_engine.runs").await;
    let period = settled::period::Period::parse(PERIOD).unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(40)
        .connect(&env.db.url)
        .await
        .unwrap();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let finishers: Vec<_> = (0..16)
        .map(|_| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                settled::settlement::job()
                    .finish_if_drained(&pool, run_id, &period.to_string(), uuid::Uuid::new_v4())
                    .await
            })
        })
        .collect();
    let mut finished = 0;
    for f in finishers {
        // Waiting on the run row, then finding it finished, is not an error.
        if f.await.unwrap().expect("a finisher failed") {
            finished += 1;
        }
    }
    assert_eq!(finished, 1, "exactly one worker finishes the run");
    let (state, items, settled): (String, i64, i64) = sqlx::query_as(
        "SELECT state, (report->>'items')::int8, (report->'counts'->>'settled')::int8 FROM settled_engine.runs",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), items, settled), ("finished", 2000, 2000));
}
