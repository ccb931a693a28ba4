//! The engine runs a job that is not settlement (examples/email_digest.rs)
//! through its API alone: the daemon starts the due run, drains and
//! finishes it; a refused item fails alone; an operator's retry reopens the
//! run and sends it once; a cancelled run is left alone until resumed.

#[path = "../../../examples/email_digest.rs"]
mod email_digest;

use std::time::Duration;

use settled_engine::daemon::DaemonConfig;
use settled_engine::{Cancelled, RunState, Schedule};
use settled_engine::{WorkOutcome, Worker};
use sqlx::PgPool;

async fn wait_for_state(pool: &PgPool, week: &str, state: RunState) -> settled_engine::Run {
    let job = email_digest::job();
    for _ in 0..600 {
        if let Some(run) = job.find_run(pool, week).await.unwrap() {
            if run.state == state {
                return run;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the run of {week} never became {}", state.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_settlement_job_sends_every_digest_exactly_once() {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPool::connect(&db.url).await.unwrap();
    let (outcome, sent) = email_digest::send_weekly_digests(&pool, "2026-11-23", 2_000)
        .await
        .unwrap();
    assert_eq!(sent, 2_000);
    assert!(
        matches!(outcome, WorkOutcome::Drained { finished: true, .. }),
        "{outcome:?}"
    );
    // A second pass finds the run finished and sends nothing more.
    let (again, sent_after) = email_digest::send_weekly_digests(&pool, "2026-11-23", 2_000)
        .await
        .unwrap();
    assert_eq!(sent_after, 2_000);
    assert!(
        matches!(again, WorkOutcome::RunNotRunning(_, RunState::Finished)),
        "{again:?}"
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_runs_as_a_daemon_with_schedule_finish_retry_and_cancel() {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPool::connect(&db.url).await.unwrap();
    email_digest::install(&pool).await.unwrap();
    let job = email_digest::job();

    // A week started by hand and cancelled before any daemon runs.
    let cancelled_week = "2026-11-16";
    email_digest::enqueue(&pool, cancelled_week, 300, None).await.unwrap();
    assert!(job.start_or_join(&pool, cancelled_week, None).await.unwrap().started);
    assert_eq!(
        job.cancel(&pool, cancelled_week).await.unwrap(),
        Cancelled::Now { released: 0 }
    );

    // The daemon: due every minute (catch-up starts today's run at once), a due time covers its own UTC date.
    let today: String = sqlx::query_scalar("SELECT (now() AT TIME ZONE 'UTC')::date::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    email_digest::enqueue(&pool, &today, 500, Some(7)).await.unwrap();
    let worker = std::sync::Arc::new(Worker::register(&pool, "test").await.unwrap());
    let daemon = {
        let (pool, worker) = (pool.clone(), worker.clone());
        tokio::spawn(async move {
            let config = DaemonConfig {
                schedule: Schedule::parse("0 * * * * *", "UTC").unwrap(),
                catch_up_days: 1,
                max_poll: Duration::from_millis(500),
                max_outage: Duration::from_secs(60),
                notifications: Some(pool.clone()),
            };
            let job = email_digest::job();
            settled_engine::daemon::run(
                &job,
                &pool,
                &email_digest::drainer(),
                &email_digest::drain_config(),
                &worker,
                &config,
            )
            .await
        })
    };

    // Finished once, with the refused digest failed alone and in the report.
    let run = wait_for_state(&pool, &today, RunState::Finished).await;
    assert_eq!(run.report.as_ref().unwrap()["counts"]["failed"], 1, "{:?}", run.report);
    assert_eq!(run.report.as_ref().unwrap()["counts"]["settled"], 499);
    assert_eq!(email_digest::sent(&pool, &today).await.unwrap(), 499);
    // The cancelled week is not touched by the daemon.
    assert_eq!(email_digest::sent(&pool, cancelled_week).await.unwrap(), 0);

    // The cause is fixed; the operator's retry reopens the run and the
    // daemon sends that one digest, once.
    sqlx::query("UPDATE digest.outbox SET topic = 'rust' WHERE topic = 'bounce'")
        .execute(&pool)
        .await
        .unwrap();
    let attempt_before: i32 =
        sqlx::query_scalar("SELECT attempt FROM digest.outbox WHERE subscriber = 'subscriber-7' AND week = $1::date")
            .bind(&today)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(job.retry_failed(&pool, &today, Some("subscriber-7")).await.unwrap(), 1);
    wait_for_state(&pool, &today, RunState::Finished).await;
    for _ in 0..600 {
        if email_digest::sent(&pool, &today).await.unwrap() == 500 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(email_digest::sent(&pool, &today).await.unwrap(), 500);
    let attempt_after: i32 =
        sqlx::query_scalar("SELECT attempt FROM digest.outbox WHERE subscriber = 'subscriber-7' AND week = $1::date")
            .bind(&today)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        attempt_after > attempt_before,
        "the attempt (fence) must never go down: {attempt_before} then {attempt_after}"
    );

    // Resumed, the cancelled week is drained and finished by the daemon.
    assert!(job.resume(&pool, cancelled_week).await.unwrap());
    wait_for_state(&pool, cancelled_week, RunState::Finished).await;
    assert_eq!(email_digest::sent(&pool, cancelled_week).await.unwrap(), 300);

    worker.request_stop();
    daemon.await.unwrap().unwrap();
    std::sync::Arc::try_unwrap(worker).unwrap().deregister().await;
    pool.close().await;
}
