//! The once-only primitives under real concurrency: many connections race,
//! the database decides.

use std::time::Duration;

use settled_engine::once::idempotency::{self, Begin, IdempotencyConfig};
use settled_engine::once::named_lease::Lease;
use settled_engine::once::token::{OnceToken, Redemption};
use sqlx::postgres::PgPoolOptions;

async fn pool() -> (settled_testkit::TestDb, sqlx::PgPool) {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPoolOptions::new().max_connections(40).connect(&db.url).await.unwrap();
    settled_engine::migrate(&pool).await.unwrap();
    (db, pool)
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_racing_reservations_of_one_token_have_one_winner() {
    let (_db, pool) = pool().await;
    let token = OnceToken::issue(&pool, "confirm-withdrawal", "0xabc", Duration::from_secs(60))
        .await
        .unwrap();
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let pool = pool.clone();
        racers.spawn(async move { OnceToken::reserve(&pool, token, "confirm-withdrawal").await.unwrap() });
    }
    let mut winners = 0;
    while let Some(won) = racers.join_next().await {
        winners += usize::from(won.unwrap());
    }
    assert_eq!(winners, 1);
    // Wrong purpose, or already reserved: refused. Released: reservable again. Completed: never again.
    assert!(!OnceToken::reserve(&pool, token, "other-purpose").await.unwrap());
    assert!(OnceToken::release(&pool, token).await.unwrap());
    assert!(OnceToken::reserve(&pool, token, "confirm-withdrawal").await.unwrap());
    assert!(OnceToken::complete(&pool, token).await.unwrap());
    assert!(!OnceToken::release(&pool, token).await.unwrap());
    assert!(!OnceToken::reserve(&pool, token, "confirm-withdrawal").await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_token_cannot_be_reserved() {
    let (_db, pool) = pool().await;
    let token = OnceToken::issue(&pool, "p", "s", Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!OnceToken::reserve(&pool, token, "p").await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redemption_says_whether_the_token_was_used_up_expired_or_refused() {
    let (_db, pool) = pool().await;
    let mut conn = pool.acquire().await.unwrap();
    let live = OnceToken::issue(&pool, "p", "s", Duration::from_secs(60))
        .await
        .unwrap();
    let redeem = |token, purpose: &'static str, subject: &'static str| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            OnceToken::redemption_in(&mut conn, token, purpose, subject)
                .await
                .unwrap()
        }
    };
    assert_eq!(redeem(live, "p", "other").await, Redemption::Refused, "another subject");
    assert_eq!(redeem(live, "other", "s").await, Redemption::Refused, "another purpose");
    assert_eq!(redeem(live, "p", "s").await, Redemption::Redeemed);
    assert_eq!(redeem(live, "p", "s").await, Redemption::Refused, "used");
    assert_eq!(
        redeem(uuid::Uuid::new_v4(), "p", "s").await,
        Redemption::Refused,
        "unknown"
    );
    let short = OnceToken::issue(&pool, "p", "s", Duration::from_millis(200))
        .await
        .unwrap();
    // Its expiry passes (the database's clock decides).
    sqlx::query("SELECT pg_sleep(0.4)").execute(&mut *conn).await.unwrap();
    assert_eq!(
        redeem(short, "p", "other").await,
        Redemption::Refused,
        "not this subject's"
    );
    assert_eq!(redeem(short, "p", "s").await, Redemption::Expired);
    assert!(!OnceToken::redeem_in(&mut conn, short, "p", "s").await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn one_idempotency_key_begins_once_and_a_crashed_attempt_is_taken_over() {
    let (_db, pool) = pool().await;
    let cfg = IdempotencyConfig {
        retention: Duration::from_secs(3600),
        // Longer than 40 racers take to connect on a loaded machine: the
        // lock's expiry below is made so in SQL, not slept.
        lock: Duration::from_secs(30),
    };
    let fp = idempotency::fingerprint("POST", "/x", b"{}");
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (pool, fp) = (pool.clone(), fp.clone());
        racers.spawn(async move { idempotency::begin(&pool, "s", "k", &fp, &cfg).await.unwrap() });
    }
    let mut outcomes = Vec::new();
    while let Some(o) = racers.join_next().await {
        outcomes.push(o.unwrap());
    }
    assert_eq!(outcomes.iter().filter(|o| **o == Begin::New).count(), 1);
    assert!(outcomes.iter().all(|o| matches!(o, Begin::New | Begin::InProgress)));
    // The winner "crashes" without finishing; after the lock, a repeat takes over.
    assert_eq!(
        idempotency::begin(&pool, "s", "k", &fp, &cfg).await.unwrap(),
        Begin::InProgress
    );
    sqlx::query("UPDATE settled_engine.idempotency_keys SET locked_until = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        idempotency::begin(&pool, "s", "k", &fp, &cfg).await.unwrap(),
        Begin::New
    );
    let mut tx = pool.begin().await.unwrap();
    idempotency::finish(&mut tx, "s", "k", 201, &serde_json::json!({"id": 7}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        idempotency::begin(&pool, "s", "k", &fp, &cfg).await.unwrap(),
        Begin::Replay {
            status: 201,
            body: serde_json::json!({"id": 7})
        }
    );
    let other = idempotency::fingerprint("POST", "/x", b"{\"a\":1}");
    assert_eq!(
        idempotency::begin(&pool, "s", "k", &other, &cfg).await.unwrap(),
        Begin::Mismatch
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_stays_its_requests_while_its_answer_is_kept_expired_or_not_and_an_unfinished_one_blames_no_one() {
    let (_db, pool) = pool().await;
    let cfg = IdempotencyConfig::default();
    let (first, other) = (
        idempotency::fingerprint("POST", "/x", b"{\"a\":1}"),
        idempotency::fingerprint("POST", "/x", b"{\"a\":7}"),
    );
    let begin = |fp: &str| {
        let (pool, fp) = (pool.clone(), fp.to_string());
        async move { idempotency::begin(&pool, "s", "k", &fp, &cfg).await.unwrap() }
    };
    assert_eq!(begin(&first).await, Begin::New);
    // While the first is running it may yet give the key back: another
    // request is told to wait, not that the key is someone else's.
    assert_eq!(begin(&other).await, Begin::InProgress);
    let mut tx = pool.begin().await.unwrap();
    idempotency::finish(&mut tx, "s", "k", 201, &serde_json::json!({"id": 1}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Past its retention, not yet pruned: still the first request's.
    let expire = "UPDATE settled_engine.idempotency_keys SET expires_at = now() - interval '1 second'";
    sqlx::query(expire).execute(&pool).await.unwrap();
    assert_eq!(begin(&other).await, Begin::Mismatch);
    assert_eq!(begin(&other).await, Begin::Mismatch);
    // A repeat of the first request runs again (its answer is past its retention).
    assert_eq!(begin(&first).await, Begin::New);
    // That attempt crashes: once its lock expires, any request may take the key.
    sqlx::query("UPDATE settled_engine.idempotency_keys SET locked_until = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(begin(&other).await, Begin::New);
    // Pruned: no trace is left here, and the key is free.
    let mut tx = pool.begin().await.unwrap();
    idempotency::finish(&mut tx, "s", "k", 409, &serde_json::json!({"refused": true}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query(expire).execute(&pool).await.unwrap();
    assert_eq!(idempotency::prune(&pool).await.unwrap(), 1);
    assert_eq!(begin(&first).await, Begin::New);
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_racing_acquisitions_of_one_lease_have_one_holder_and_fences_grow() {
    let (_db, pool) = pool().await;
    let mut racers = tokio::task::JoinSet::new();
    for i in 0..30 {
        let pool = pool.clone();
        racers.spawn(async move {
            // Longer than 30 racers take to connect on a loaded machine.
            Lease::acquire(&pool, "job", &format!("h{i}"), Duration::from_secs(30))
                .await
                .unwrap()
        });
    }
    let mut held = Vec::new();
    while let Some(l) = racers.join_next().await {
        held.extend(l.unwrap());
    }
    assert_eq!(held.len(), 1);
    let first = held.pop().unwrap();
    // The database clock passes the lease (made so in SQL, not slept).
    sqlx::query("UPDATE settled_engine.leases SET expires_at = now() - interval '1 second' WHERE name = 'job'")
        .execute(&pool)
        .await
        .unwrap();
    // Expired: the stale holder can neither renew nor release; the next one gets a greater fence.
    assert!(!first.renew(&pool, Duration::from_secs(1)).await.unwrap());
    let second = Lease::acquire(&pool, "job", "h-next", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert!(second.fence > first.fence);
    assert!(!first.release(&pool).await.unwrap());
    assert!(second.renew(&pool, Duration::from_secs(5)).await.unwrap());
    assert!(second.release(&pool).await.unwrap());
}
