//! Retention: finished jobs leave after their retention, by one holder at
//! a time, and an unfinished job never does.

use std::time::Duration;

use settled_engine::continuous::serve::Retention;
use settled_engine::continuous::NewJob;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn retention_removes_finished_jobs_past_their_time_and_never_an_unfinished_one() {
    let env = env().await;
    let q = queue();
    let mut conn = env.pool.acquire().await.unwrap();
    let jobs: Vec<NewJob> = (0..12_000).map(|i| NewJob::new(format!("j{i:05}"))).collect();
    for part in jobs.chunks(6_000) {
        q.enqueue_many(&mut conn, part).await.unwrap();
    }
    // Every state a job can be in, all of them "old" (made so in SQL).
    sqlx::query(
        "UPDATE jobs.queue SET updated_at = now() - interval '2 days',
             status = CASE WHEN key < 'j10000' THEN 'settled'
                           WHEN key < 'j10500' THEN 'cancelled'
                           WHEN key < 'j11000' THEN 'failed'
                           WHEN key < 'j11500' THEN 'processing'
                           ELSE 'eligible' END,
             lease_until = CASE WHEN key >= 'j11000' AND key < 'j11500' THEN now() + interval '1 hour' END",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    // A replay racing the pruner: 100 dead letters made eligible again.
    sqlx::query("UPDATE jobs.queue SET status = 'eligible' WHERE key >= 'j10500' AND key < 'j10600'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let retention = Retention {
        finished: Duration::from_secs(3600),
        failed: Duration::from_secs(3600),
        interval: Duration::from_secs(1),
    };
    // Four pruners at once: one holder at a time, the others skip.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (pool, q, r) = (env.pool.clone(), q.clone(), retention);
        tasks.push(tokio::spawn(async move { q.prune(&pool, &r).await.unwrap() }));
    }
    let mut removed = 0;
    for task in tasks {
        removed += task.await.unwrap().unwrap_or(0);
    }
    // Pruners that found the lock taken did nothing; run once more to finish.
    removed += q.prune(&env.pool, &retention).await.unwrap().unwrap_or(0);
    assert_eq!(removed, 10_000 + 500 + 400);
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.queue WHERE status IN ('eligible', 'processing')"
        )
        .await,
        1_100
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.queue").await, 1_100);
    // Recent finished jobs stay.
    sqlx::query("UPDATE jobs.queue SET status = 'settled', updated_at = now() WHERE key >= 'j11500'")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(q.prune(&env.pool, &retention).await.unwrap(), Some(0));
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.queue").await, 1_100);
}
