//! Serving: a long job keeps its lease while its worker lives; a stop lets
//! work in hand finish and gives back what was not started.

use std::sync::Arc;
use std::time::Duration;

use settled_engine::continuous::NewJob;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_long_leased_job_keeps_its_lease_while_its_worker_lives() {
    let env = env().await;
    receiver(&env.pool).await;
    let mut conn = env.pool.acquire().await.unwrap();
    queue().enqueue(&mut conn, &NewJob::new("long")).await.unwrap();
    // Work of over two lease lengths (ttl 5 s): renewed every ttl/3, never
    // rescued. The ttl leaves a renewal seconds of slack on a loaded machine.
    let handler = Arc::new(LeasedScripted {
        script: Script {
            work: Duration::from_secs(12),
            worker: "w".into(),
            ..Script::default()
        },
        pool: env.pool.clone(),
    });
    let mut cfg = polling(config(1, 1));
    cfg.lease.ttl = Duration::from_secs(5);
    let serving = Serving::leased(&env.pool, handler, cfg);
    wait_for(
        &env.pool,
        "SELECT count(*) FROM jobs.queue WHERE status = 'settled'",
        1,
        90,
    )
    .await;
    serving.stop().await;
    assert_eq!(
        count(&env.pool, "SELECT attempt::bigint FROM jobs.queue WHERE key = 'long'").await,
        1
    );
    assert_eq!(
        count(&env.pool, "SELECT calls::bigint FROM jobs.receiver WHERE key = 'long'").await,
        1
    );
    assert_eq!(
        count(&env.pool, "SELECT jsonb_array_length(errors)::bigint FROM jobs.queue").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_finishes_work_in_hand_and_gives_back_what_was_not_started() {
    let env = env().await;
    receiver(&env.pool).await;
    let jobs: Vec<NewJob> = (0..20).map(|i| NewJob::new(format!("s{i:02}"))).collect();
    let mut conn = env.pool.acquire().await.unwrap();
    queue().enqueue_many(&mut conn, &jobs).await.unwrap();
    // One call at a time, one second each, a batch of 20: at the stop one
    // job is in hand; the grace (2 s) lets a couple more start, no more.
    let handler = Arc::new(LeasedScripted {
        script: Script {
            work: Duration::from_secs(1),
            worker: "w".into(),
            ..Script::default()
        },
        pool: env.pool.clone(),
    });
    let mut cfg = polling(config(1, 20));
    cfg.lease.calls_in_flight = 1;
    cfg.lease.ttl = Duration::from_secs(30);
    let serving = Serving::leased(&env.pool, handler, cfg);
    wait_for(&env.pool, "SELECT count(*) FROM jobs.receiver", 1, 30).await;
    serving.stop().await;
    let settled = count(&env.pool, "SELECT count(*) FROM jobs.queue WHERE status = 'settled'").await;
    let eligible = count(
        &env.pool,
        "SELECT count(*) FROM jobs.queue WHERE status = 'eligible' AND lease_owner IS NULL",
    )
    .await;
    assert!((1..20).contains(&settled), "{settled} settled");
    assert_eq!(settled + eligible, 20, "nothing left processing after the stop");
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.receiver").await, settled);
}
