//! Failures: a poison item fails alone; a statement the deployment cannot
//! run stops the drain and fails no item.

use std::time::Duration;

use settled_engine::{EngineError, Worker};

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_item_fails_alone_and_the_rest_settle_once() {
    let env = env(500).await;
    let worker = Worker::register(&env.pool, "test").await.unwrap();
    let outcome = job()
        .work(&env.pool, SCOPE, &drainer(&["item-123"]), &config(50, 4), &worker)
        .await
        .unwrap();
    assert!(
        matches!(outcome, settled_engine::WorkOutcome::Drained { finished: true, .. }),
        "{outcome:?}"
    );
    worker.deregister().await;
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.items WHERE status = 'failed'").await,
        1
    );
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.items WHERE status = 'failed' AND item = 'item-123'"
        )
        .await,
        1
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.effects").await, 499);
    // Every effect carries the fence its item was settled with.
    let mismatched = count(
        &env.pool,
        "SELECT count(*) FROM jobs.effects e JOIN jobs.items i USING (day, item) WHERE e.fence <> i.attempt",
    )
    .await;
    assert_eq!(mismatched, 0);
}

/// A statement no retry can help (its table is gone: SQLSTATE 42P01, as a
/// missing grant is 42501) is the deployment's fault, not an item's: the
/// drain stops at once, says the role, and no item is failed or touched.
#[tokio::test(flavor = "multi_thread")]
async fn a_statement_the_deployment_cannot_run_stops_the_drain_at_once_and_fails_no_item() {
    let env = env(500).await;
    sqlx::query("DROP TABLE jobs.effects").execute(&env.pool).await.unwrap();
    let worker = Worker::register(&env.pool, "test").await.unwrap();
    let worked = tokio::time::timeout(
        Duration::from_secs(30),
        job().work(&env.pool, SCOPE, &drainer(&[]), &config(50, 4), &worker),
    )
    .await
    .expect("the drain ends by itself");
    worker.deregister().await;
    match worked {
        Err(EngineError::Refused {
            role, code, message, ..
        }) => {
            assert_eq!(code, "42P01");
            assert!(message.contains("jobs.effects"), "{message}");
            assert_eq!(role, "postgres");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.items WHERE status = 'eligible' AND attempt = 0"
        )
        .await,
        500
    );
}
