//! Enqueue: the job exists if and only if the caller's transaction
//! commits; a key is one job however often it is enqueued.

use settled_engine::continuous::{Enqueued, NewJob};
use sqlx::Connection;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_enqueue_in_a_rolled_back_transaction_runs_nothing_and_a_key_enqueued_twice_runs_once() {
    let env = env().await;
    let q = queue();
    let mut conn = env.pool.acquire().await.unwrap();

    // Rolled back: no job, no effect, ever.
    let mut tx = conn.begin().await.unwrap();
    assert_eq!(
        q.enqueue(&mut tx, &NewJob::new("rolled-back")).await.unwrap(),
        Enqueued::New
    );
    tx.rollback().await.unwrap();

    // Committed twice under one key, once in a bulk enqueue with duplicates.
    let mut tx = conn.begin().await.unwrap();
    assert_eq!(q.enqueue(&mut tx, &NewJob::new("twice")).await.unwrap(), Enqueued::New);
    tx.commit().await.unwrap();
    assert_eq!(
        q.enqueue(&mut conn, &NewJob::new("twice")).await.unwrap(),
        Enqueued::AlreadyThere
    );
    let bulk: Vec<NewJob> = ["twice", "b1", "b2", "b1"].iter().map(|k| NewJob::new(*k)).collect();
    assert_eq!(
        q.enqueue_many(&mut conn, &bulk).await.unwrap(),
        2,
        "b1 and b2 are new; twice and the second b1 are not"
    );
    // A plain INSERT from any language is an enqueue too.
    sqlx::query("INSERT INTO jobs.queue (key, payload) VALUES ('plain', '{\"to\": \"x@example.org\"}')")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);

    let handler = TxScripted::new(Script::default());
    let serving = Serving::tx(&env.pool, handler.clone(), polling(config(2, 4)));
    wait_for_status(&env.pool, "settled", 4).await;
    serving.stop().await;
    assert_effects_once(&env.pool, 4).await;
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.effects WHERE key = 'rolled-back'").await,
        0
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.queue").await, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bulk_enqueue_of_thousands_is_one_statement_in_the_order_given() {
    let env = env().await;
    let q = queue();
    let jobs: Vec<NewJob> = (0..5_000).rev().map(|i| NewJob::new(format!("k{i:05}"))).collect();
    let mut conn = env.pool.acquire().await.unwrap();
    assert_eq!(q.enqueue_many(&mut conn, &jobs).await.unwrap(), 5_000);
    // Enqueue order follows the order given (k04999 first), not the keys.
    let first: String = sqlx::query_scalar("SELECT key FROM jobs.queue ORDER BY seq LIMIT 1")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(first, "k04999");
    let too_many: Vec<NewJob> = (0..10_001).map(|i| NewJob::new(format!("x{i}"))).collect();
    let err = q.enqueue_many(&mut conn, &too_many).await.unwrap_err().to_string();
    assert!(err.contains("at most 10000"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_without_the_columns_indexes_or_trigger_is_named_at_declare() {
    let env = env().await;
    sqlx::query("CREATE TABLE jobs.bare (key text PRIMARY KEY, status text, attempt integer)")
        .execute(&env.pool)
        .await
        .unwrap();
    let bare = settled_engine::continuous::Queue::new("bare", "jobs.bare").unwrap();
    let mut conn = env.pool.acquire().await.unwrap();
    let err = bare.declare(&mut conn).await.unwrap_err().to_string();
    for missing in [
        "column payload",
        "column not_before",
        "column fence_epoch",
        "(priority, not_before, seq) WHERE status = 'eligible'",
        "(lease_until) WHERE status = 'processing'",
        "the wake-up trigger",
    ] {
        assert!(err.contains(missing), "{missing} not named in: {err}");
    }
    assert!(!err.contains("column status"), "{err}");
    queue().declare(&mut conn).await.unwrap();
}
