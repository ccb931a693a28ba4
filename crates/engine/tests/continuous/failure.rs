//! Failure: a refused or panicking job fails alone; failed attempts back
//! off and end as dead letters with their history; replay and cancel; a
//! snooze spends no attempt; a dead leased worker's jobs come back after
//! the lease, and its late completion is refused by the fence.

use std::time::Duration;

use settled_engine::continuous::{NewJob, ReplayFilter};
use uuid::Uuid;

use crate::common::*;

async fn enqueue(env: &Env, keys: &[&str]) {
    let jobs: Vec<NewJob> = keys.iter().map(|k| NewJob::new(*k)).collect();
    let mut conn = env.pool.acquire().await.unwrap();
    queue().enqueue_many(&mut conn, &jobs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_or_panicking_job_fails_alone_and_becomes_a_dead_letter_with_its_history() {
    let env = env().await;
    let keys: Vec<String> = (0..40).map(|i| format!("job-{i:02}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    enqueue(&env, &refs).await;
    let script = Script {
        poison: ["job-07".to_string()].into(),
        panics: ["job-23".to_string()].into(),
        ..Script::default()
    };
    // Batches of 8: each failure rolls its batch back; the others run alone.
    let serving = Serving::tx(&env.pool, TxScripted::new(script), polling(config(2, 8)));
    wait_for_status(&env.pool, "settled", 38).await;
    // The panicking job is retried (3 attempts), then dead too.
    wait_for_status(&env.pool, "failed", 2).await;
    serving.stop().await;
    assert_effects_once(&env.pool, 38).await;
    // The poison job failed at once (permanent): one attempt in its history.
    assert_eq!(
        count(
            &env.pool,
            "SELECT jsonb_array_length(errors)::bigint FROM jobs.queue WHERE key = 'job-07'"
        )
        .await,
        1
    );
    // The panic is a failed attempt each time, three in all, then dead.
    assert_eq!(
        count(
            &env.pool,
            "SELECT jsonb_array_length(errors)::bigint FROM jobs.queue WHERE key = 'job-23'"
        )
        .await,
        3
    );
    let last: String = sqlx::query_scalar("SELECT last_error FROM jobs.queue WHERE key = 'job-23'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(last.contains("panicked"), "{last}");
    let stats = queue().stats(&mut env.pool.acquire().await.unwrap()).await.unwrap();
    assert_eq!(stats.failed, 2);

    // Replay one by key, then the rest by filter: they run, once.
    let mut conn = env.pool.acquire().await.unwrap();
    let q = queue();
    assert_eq!(q.replay(&mut conn, &ReplayFilter::key("job-07")).await.unwrap(), 1);
    let filter = ReplayFilter {
        error_contains: Some("panicked".into()),
        limit: 100,
        ..ReplayFilter::default()
    };
    assert_eq!(q.replay(&mut conn, &filter).await.unwrap(), 1);
    assert_eq!(q.replay(&mut conn, &filter).await.unwrap(), 0, "nothing left to replay");
    drop(conn);
    let serving = Serving::tx(&env.pool, TxScripted::new(Script::default()), polling(config(2, 8)));
    wait_for_status(&env.pool, "settled", 40).await;
    serving.stop().await;
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.effects").await, 40);
    // The fence never went down: the replayed attempt is above every earlier one.
    assert_eq!(
        count(
            &env.pool,
            "SELECT (attempt - attempt_base)::bigint FROM jobs.queue WHERE key = 'job-23'"
        )
        .await,
        1
    );
    assert!(count(&env.pool, "SELECT attempt::bigint FROM jobs.queue WHERE key = 'job-23'").await >= 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snooze_spends_no_attempt_and_cancel_takes_only_a_job_not_started() {
    let env = env().await;
    enqueue(&env, &["snoozy", "cancel-me", "ok"]).await;
    let mut conn = env.pool.acquire().await.unwrap();
    assert!(queue().cancel(&mut conn, "cancel-me").await.unwrap());
    assert!(
        !queue().cancel(&mut conn, "cancel-me").await.unwrap(),
        "already cancelled"
    );
    let script = Script {
        snooze: ["snoozy".to_string()].into(),
        ..Script::default()
    };
    let serving = Serving::tx(&env.pool, TxScripted::new(script), polling(config(1, 1)));
    wait_for(&env.pool, "SELECT count(*) FROM jobs.effects", 1, 30).await;
    wait_for(
        &env.pool,
        "SELECT count(*) FROM jobs.queue WHERE key = 'snoozy' AND not_before > now() + interval '30 minutes'",
        1,
        30,
    )
    .await;
    serving.stop().await;
    assert_eq!(
        count(&env.pool, "SELECT attempt::bigint FROM jobs.queue WHERE key = 'snoozy'").await,
        0
    );
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.queue WHERE key = 'cancel-me' AND status = 'cancelled'"
        )
        .await,
        1
    );
    assert!(
        !queue().cancel(&mut conn, "ok").await.unwrap(),
        "a settled job cannot be cancelled"
    );
    // A job held by a transaction has started: cancel leaves it alone.
    enqueue(&env, &["held"]).await;
    let mut holder = env.pool.begin().await.unwrap();
    let claimed = queue().claim_in_tx(&mut holder, 1).await.unwrap();
    assert_eq!(claimed[0].0.key, "held");
    assert!(!queue().cancel(&mut conn, "held").await.unwrap());
    holder.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_leased_workers_jobs_come_back_after_the_lease_and_its_late_completion_is_refused() {
    let env = env().await;
    receiver(&env.pool).await;
    enqueue(&env, &["a", "b", "c"]).await;
    let q = queue();
    // A worker claims with a lease, then "dies": it never renews.
    let zombie = Uuid::new_v4();
    let mut conn = env.pool.acquire().await.unwrap();
    let claimed = q
        .claim_leased(&mut conn, 3, zombie, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    let stale: Vec<_> = claimed.into_iter().map(|(job, _)| job).collect();
    // Its leases expire (made so in SQL, not by sleeping).
    sqlx::query("UPDATE jobs.queue SET lease_until = now() - interval '1 second'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let handler = std::sync::Arc::new(LeasedScripted {
        script: Script {
            worker: "live".into(),
            ..Script::default()
        },
        pool: env.pool.clone(),
    });
    let serving = Serving::leased(&env.pool, handler, polling(config(2, 2)));
    wait_for_status(&env.pool, "settled", 3).await;
    serving.stop().await;
    // The zombie wakes and completes: every one refused by the fence.
    let mut tx = env.pool.begin().await.unwrap();
    assert!(q.complete_fenced(&mut tx, &stale).await.unwrap().is_empty());
    tx.commit().await.unwrap();
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.effects").await, 3);
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.effects WHERE worker = 'live'").await,
        3
    );
    // The rescue counted the lost attempt; the history says why.
    let why: String = sqlx::query_scalar("SELECT errors->0->>'error' FROM jobs.queue WHERE key = 'a'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(why.contains("lease expired"), "{why}");
}
