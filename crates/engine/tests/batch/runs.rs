//! Runs: one finisher, cancel and resume, retry, daemons, the work table's
//! check at start.

use std::sync::Arc;
use std::time::Duration;

use settled_engine::daemon::DaemonConfig;
use settled_engine::{Cancelled, EngineError, RunState, Schedule, Worker};

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn one_finisher_among_sixteen_racers() {
    let env = env(200).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    sqlx::query("UPDATE jobs.items SET status = 'settled'")
        .execute(&env.pool)
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let racers: Vec<_> = (0..16)
        .map(|_| {
            let (pool, barrier) = (env.pool.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                job()
                    .finish_if_drained(&pool, run.id, SCOPE, uuid::Uuid::new_v4())
                    .await
            })
        })
        .collect();
    let mut finished = 0;
    for racer in racers {
        if racer.await.unwrap().expect("no racer fails") {
            finished += 1;
        }
    }
    assert_eq!(finished, 1);
    let run = job().find_run(&env.pool, SCOPE).await.unwrap().unwrap();
    assert_eq!(run.state, RunState::Finished);
    assert_eq!(run.report.unwrap()["counts"]["settled"], 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_gives_back_leases_stops_claims_and_resume_restarts_them() {
    let env = env(50).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    let queue = job().queue().clone();
    let mut conn = env.pool.acquire().await.unwrap();
    let leased = queue
        .claim_leased(
            &mut conn,
            SCOPE,
            20,
            run.id,
            uuid::Uuid::new_v4(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(
        job().cancel(&env.pool, SCOPE).await.unwrap(),
        Cancelled::Now { released: 20 }
    );
    assert_eq!(
        job().cancel(&env.pool, SCOPE).await.unwrap(),
        Cancelled::NotRunning(Some(RunState::Cancelled))
    );
    let mut tx = env.pool.begin().await.unwrap();
    assert!(queue
        .claim_chunk_in_tx(&mut tx, SCOPE, 50, run.id)
        .await
        .unwrap()
        .is_empty());
    // The old holder of a released lease is refused by its fence.
    assert!(queue.complete_fenced(&mut tx, SCOPE, &leased).await.unwrap().is_empty());
    tx.rollback().await.unwrap();
    assert!(job().resume(&env.pool, SCOPE).await.unwrap());
    let mut tx = env.pool.begin().await.unwrap();
    assert_eq!(
        queue.claim_chunk_in_tx(&mut tx, SCOPE, 50, run.id).await.unwrap().len(),
        50
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_keeps_the_attempt_monotonic_and_reopens_the_run() {
    let env = env(20).await;
    let worker = Worker::register(&env.pool, "test").await.unwrap();
    job()
        .work(&env.pool, SCOPE, &drainer(&["item-7"]), &config(10, 1), &worker)
        .await
        .unwrap();
    let failed_attempt = count(
        &env.pool,
        "SELECT attempt::bigint FROM jobs.items WHERE item = 'item-7'",
    )
    .await;
    assert!(failed_attempt >= 1);
    assert_eq!(job().retry_failed(&env.pool, SCOPE, Some("item-7")).await.unwrap(), 1);
    assert_eq!(
        job().find_run(&env.pool, SCOPE).await.unwrap().unwrap().state,
        RunState::Running
    );
    let (attempt, base) =
        sqlx::query_as::<_, (i32, i32)>("SELECT attempt, attempt_base FROM jobs.items WHERE item = 'item-7'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!((i64::from(attempt), i64::from(base)), (failed_attempt, failed_attempt));
    job()
        .work(&env.pool, SCOPE, &drainer(&[]), &config(10, 1), &worker)
        .await
        .unwrap();
    worker.deregister().await;
    let settled_attempt = count(
        &env.pool,
        "SELECT attempt::bigint FROM jobs.items WHERE item = 'item-7' AND status = 'settled'",
    )
    .await;
    assert!(
        settled_attempt > failed_attempt,
        "{settled_attempt} after {failed_attempt}"
    );
    assert_eq!(
        job().find_run(&env.pool, SCOPE).await.unwrap().unwrap().state,
        RunState::Finished
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_daemons_make_one_run_per_due_time_and_settle_it_once() {
    let env = env(0).await;
    let today: String = sqlx::query_scalar("SELECT (now() AT TIME ZONE 'UTC')::date::text")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    add_items(&env.pool, &today, 2_000).await;
    let mut daemons = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..10 {
        let worker = Arc::new(Worker::register(&env.pool, "test").await.unwrap());
        workers.push(worker.clone());
        let pool = env.pool.clone();
        daemons.push(tokio::spawn(async move {
            let daemon = DaemonConfig {
                schedule: Schedule::parse("0 * * * * *", "UTC").unwrap(),
                catch_up_days: 1,
                max_poll: Duration::from_millis(300),
                max_outage: Duration::from_secs(60),
                notifications: Some(pool.clone()),
            };
            settled_engine::daemon::run(&job(), &pool, &drainer(&[]), &config(20, 2), &worker, &daemon).await
        }));
    }
    for _ in 0..600 {
        let run = job().find_run(&env.pool, &today).await.unwrap();
        if run.is_some_and(|r| r.state == RunState::Finished) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for worker in &workers {
        worker.request_stop();
    }
    for daemon in daemons {
        daemon.await.unwrap().unwrap();
    }
    assert_eq!(count(&env.pool, "SELECT count(*) FROM settled_engine.runs").await, 1);
    assert_eq!(
        job().find_run(&env.pool, &today).await.unwrap().unwrap().state,
        RunState::Finished
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.effects").await, 2_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_work_table_missing_columns_and_indexes_is_named_at_start() {
    let env = env(0).await;
    sqlx::query("CREATE TABLE jobs.bare (day date, item text, status text)")
        .execute(&env.pool)
        .await
        .unwrap();
    let bare = job_on("bare", "jobs.bare");
    let err = bare.check_work_table(&env.pool).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, EngineError::WorkTable { .. }), "{text}");
    for missing in [
        "attempt_base",
        "lease_until",
        "a unique index on (day, item)",
        "WHERE status = 'eligible'",
        "an index on (item) WHERE status = 'held'",
    ] {
        assert!(text.contains(missing), "{missing} not named in: {text}");
    }
    job().check_work_table(&env.pool).await.unwrap();
}
