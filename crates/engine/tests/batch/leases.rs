//! Leases: a zombie's completion refused by its fence, expired leases rescued.

use std::time::Duration;

use settled_engine::RetryPolicy;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_zombies_completion_is_refused_by_its_fence() {
    let env = env(10).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    let queue = job().queue().clone();
    let (zombie, other) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let mut conn = env.pool.acquire().await.unwrap();
    let lost = queue
        .claim_leased(&mut conn, SCOPE, 10, run.id, zombie, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(lost.len(), 10);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rescued = queue
        .rescue_expired(
            &mut conn,
            SCOPE,
            &RetryPolicy {
                backoff_base_ms: 0,
                ..RetryPolicy::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(rescued.retried, 10);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let fresh = queue
        .claim_leased(&mut conn, SCOPE, 10, run.id, other, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(fresh.len(), 10);
    assert!(fresh
        .iter()
        .all(|f| lost.iter().all(|l| l.key != f.key || l.fence < f.fence)));
    // The zombie wakes and completes with its old fences: nothing accepted.
    let mut tx = env.pool.begin().await.unwrap();
    assert!(queue.complete_fenced(&mut tx, SCOPE, &lost).await.unwrap().is_empty());
    tx.commit().await.unwrap();
    let mut tx = env.pool.begin().await.unwrap();
    assert_eq!(queue.complete_fenced(&mut tx, SCOPE, &fresh).await.unwrap().len(), 10);
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_leases_are_rescued_and_fail_once_their_attempts_are_spent() {
    let env = env(5).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    let queue = job().queue().clone();
    let mut conn = env.pool.acquire().await.unwrap();
    let policy = RetryPolicy {
        max_attempts: 2,
        backoff_base_ms: 0,
        backoff_cap_ms: 0,
    };
    for round in 1..=2 {
        let worker = uuid::Uuid::new_v4();
        let claimed = queue
            .claim_leased(&mut conn, SCOPE, 5, run.id, worker, Duration::from_millis(300))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 5, "round {round}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let outcome = queue.rescue_expired(&mut conn, SCOPE, &policy).await.unwrap();
        if round == 1 {
            assert_eq!((outcome.retried, outcome.failed), (5, 0));
        } else {
            assert_eq!((outcome.retried, outcome.failed), (0, 5));
        }
    }
    let failed = count(
        &env.pool,
        "SELECT count(*) FROM jobs.items WHERE status = 'failed' AND last_error LIKE 'lease expired%'",
    )
    .await;
    assert_eq!(failed, 5);
}
