//! Which job runs first: strictly by priority, then by when it may run,
//! then in enqueue order; nothing before its `not_before`; nothing while
//! the queue is paused.

use std::time::Duration;

use settled_engine::continuous::NewJob;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn priorities_run_strictly_first_then_enqueue_order_and_not_before_is_honoured() {
    let env = env().await;
    let q = queue();
    let mut conn = env.pool.acquire().await.unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let jobs = vec![
        NewJob::new("low-1").priority(5),
        NewJob::new("high-1").priority(-1),
        NewJob::new("mid-1"),
        NewJob::new("high-2").priority(-1),
        NewJob::new("mid-2"),
        NewJob::new("low-2").priority(5),
        NewJob::new("scheduled").priority(-5).not_before(later),
    ];
    q.enqueue_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    // One loop, one job per claim: the effects' order is the run order.
    let serving = Serving::tx(&env.pool, TxScripted::new(Script::default()), polling(config(1, 1)));
    wait_for(&env.pool, "SELECT count(*) FROM jobs.effects", 6, 30).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    serving.stop().await;
    let order: Vec<String> = sqlx::query_scalar("SELECT key FROM jobs.effects ORDER BY at")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    assert_eq!(order, ["high-1", "high-2", "mid-1", "mid-2", "low-1", "low-2"]);
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.queue WHERE key = 'scheduled' AND status = 'eligible'"
        )
        .await,
        1,
        "a job is not claimed before its not_before, whatever its priority"
    );
    // Its time comes (made so in SQL): it runs.
    sqlx::query("UPDATE jobs.queue SET not_before = now() WHERE key = 'scheduled'")
        .execute(&env.pool)
        .await
        .unwrap();
    let serving = Serving::tx(&env.pool, TxScripted::new(Script::default()), polling(config(1, 1)));
    wait_for(
        &env.pool,
        "SELECT count(*) FROM jobs.effects WHERE key = 'scheduled'",
        1,
        30,
    )
    .await;
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_stops_claims_within_one_poll_and_a_resume_wakes_the_workers() {
    let env = env().await;
    let q = queue();
    let mut conn = env.pool.acquire().await.unwrap();
    assert!(q.pause(&mut conn).await.unwrap(), "the first pause changes the queue");
    assert!(!q.pause(&mut conn).await.unwrap(), "a second pause is a no-op");
    q.enqueue(&mut conn, &NewJob::new("while-paused")).await.unwrap();
    // Listening, with a long poll: the resume's notification must wake it.
    let mut cfg = config(2, 1);
    cfg.poll = Duration::from_secs(60);
    let serving = Serving::tx(&env.pool, TxScripted::new(Script::default()), cfg);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.effects").await,
        0,
        "nothing runs while paused"
    );
    assert!(q.is_paused(&mut conn).await.unwrap());
    assert!(q.resume(&mut conn).await.unwrap());
    assert!(!q.resume(&mut conn).await.unwrap(), "a second resume is a no-op");
    wait_for(&env.pool, "SELECT count(*) FROM jobs.effects", 1, 20).await;
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_worker_wakes_by_listen_long_before_its_poll() {
    let env = env().await;
    let mut cfg = config(1, 1);
    cfg.poll = Duration::from_secs(120);
    let serving = Serving::tx(&env.pool, TxScripted::new(Script::default()), cfg);
    // Let the loop find the queue empty and go to sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut conn = env.pool.acquire().await.unwrap();
    queue().enqueue(&mut conn, &NewJob::new("wake-me")).await.unwrap();
    // Within the poll the job could only run through the notification.
    wait_for(&env.pool, "SELECT count(*) FROM jobs.effects", 1, 60).await;
    serving.stop().await;
}
