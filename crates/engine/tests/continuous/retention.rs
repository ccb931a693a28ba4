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
    let retention = an_hour();
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

#[tokio::test(flavor = "multi_thread")]
async fn retention_moves_past_jobs_a_trigger_keeps_within_one_prune() {
    let env = env().await;
    let q = queue();
    let mut conn = env.pool.acquire().await.unwrap();
    // More jobs a trigger keeps than one prune batch takes (the engine's
    // batch is 5,000 jobs and not public: 5,100 is one batch and a part),
    // then 100 deletable jobs finished at the same instant (their keys sort
    // after the kept ones), 900 deletable jobs finished later, and 300
    // unfinished jobs older than all of them.
    let keys = (0..5_100)
        .map(|i| format!("guarded-{i:05}"))
        .chain((0..100).map(|i| format!("tied-{i:05}")))
        .chain((0..900).map(|i| format!("later-{i:05}")))
        .chain((0..300).map(|i| format!("open-{i:05}")));
    let jobs: Vec<NewJob> = keys.map(NewJob::new).collect();
    for part in jobs.chunks(5_000) {
        q.enqueue_many(&mut conn, part).await.unwrap();
    }
    // Like settled's payout jobs: a delete the application refuses leaves the row.
    sqlx::raw_sql(
        "CREATE FUNCTION jobs.keep_guarded() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.key LIKE 'guarded-%' THEN RETURN NULL; END IF;
             RETURN OLD;
         END $$;
         CREATE TRIGGER queue_keep_guarded BEFORE DELETE ON jobs.queue
             FOR EACH ROW EXECUTE FUNCTION jobs.keep_guarded();",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    // Made old in SQL; one statement, so the kept and tied jobs share one updated_at.
    sqlx::query(
        "UPDATE jobs.queue SET updated_at = now() - interval '3 days',
             status = CASE WHEN key < 'guarded-02000' THEN 'failed' ELSE 'settled' END
         WHERE key LIKE 'guarded-%' OR key LIKE 'tied-%'",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE jobs.queue SET updated_at = now() - interval '2 days',
             status = CASE WHEN key < 'later-00300' THEN 'cancelled'
                           WHEN key < 'later-00600' THEN 'failed'
                           ELSE 'settled' END
         WHERE key LIKE 'later-%'",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE jobs.queue SET updated_at = now() - interval '4 days',
             status = CASE WHEN key < 'open-00150' THEN 'processing' ELSE 'eligible' END,
             lease_until = CASE WHEN key < 'open-00150' THEN now() + interval '1 hour' END
         WHERE key LIKE 'open-%'",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let retention = an_hour();
    // One prune call gets past the kept jobs to the deletable ones.
    assert_eq!(q.prune(&env.pool, &retention).await.unwrap(), Some(1_000));
    let left = |sql: &'static str| count(&env.pool, sql);
    assert_eq!(
        left("SELECT count(*) FROM jobs.queue WHERE key LIKE 'tied-%' OR key LIKE 'later-%'").await,
        0
    );
    assert_eq!(
        left("SELECT count(*) FROM jobs.queue WHERE key LIKE 'guarded-%' AND status IN ('settled', 'failed')").await,
        5_100
    );
    assert_eq!(
        left("SELECT count(*) FROM jobs.queue WHERE key LIKE 'open-%' AND status IN ('eligible', 'processing')").await,
        300
    );
    assert_eq!(left("SELECT count(*) FROM jobs.queue").await, 5_400);
    // Nothing deletable is left: the next prune removes nothing and ends.
    assert_eq!(q.prune(&env.pool, &retention).await.unwrap(), Some(0));
    assert_eq!(left("SELECT count(*) FROM jobs.queue").await, 5_400);
}

/// Finished jobs and dead letters kept an hour.
fn an_hour() -> Retention {
    Retention {
        finished: Duration::from_secs(3600),
        failed: Duration::from_secs(3600),
        interval: Duration::from_secs(1),
    }
}
