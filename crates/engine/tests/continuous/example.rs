//! The webhook example (examples/webhook_sender.rs) against a receiver
//! that fails, rate-limits and refuses: each committed order is applied
//! once at the receiver (by the job's key), a rolled-back order sends
//! nothing, a refused webhook is a dead letter until replayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use settled_engine::continuous::ReplayFilter;
use settled_engine::ServeStats;
use sqlx::PgPool;

#[path = "../../../../examples/webhook_sender.rs"]
#[allow(dead_code)]
mod webhook_sender;

/// Calls per idempotency key; and the orders the receiver applied.
#[derive(Default)]
struct Receiver {
    calls: HashMap<String, u32>,
    applied: Vec<i64>,
    refuse: Option<i64>,
}

/// A receiver on 127.0.0.1: every 4th key's first call gets 503 and every
/// 7th key's first call 429; order `refuse` gets 400 while it is set.
async fn faulty_receiver(state: Arc<Mutex<Receiver>>) -> String {
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, axum::Json(hook): axum::Json<webhook_sender::Webhook>| {
                let state = state.clone();
                async move {
                    let key = headers.get("idempotency-key").unwrap().to_str().unwrap().to_string();
                    let mut s = state.lock().unwrap();
                    if s.refuse == Some(hook.order) {
                        return axum::http::StatusCode::BAD_REQUEST;
                    }
                    let calls = s.calls.entry(key).or_insert(0);
                    *calls += 1;
                    let first = *calls == 1;
                    if first && hook.order % 4 == 0 {
                        return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                    }
                    if first && hook.order % 7 == 0 {
                        return axum::http::StatusCode::TOO_MANY_REQUESTS;
                    }
                    if *calls == 1 || !s.applied.contains(&hook.order) {
                        s.applied.push(hook.order);
                    }
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_example_applies_each_committed_order_once_and_dead_letters_a_refusal() {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPool::connect(&db.url).await.unwrap();
    webhook_sender::install(&pool).await.unwrap();
    let state = Arc::new(Mutex::new(Receiver {
        refuse: Some(13),
        ..Receiver::default()
    }));
    let url = faulty_receiver(state.clone()).await;
    // Two delivering processes' worth of loops, started before the orders.
    let stats: Vec<Arc<ServeStats>> = (0..2).map(|_| Arc::new(ServeStats::default())).collect();
    let serving: Vec<_> = stats
        .iter()
        .map(|s| {
            let (pool, s) = (pool.clone(), s.clone());
            tokio::spawn(async move { webhook_sender::deliver(&pool, 2, s).await })
        })
        .collect();
    // Orders from four connections at once; order 99's transaction fails
    // after its enqueue (a duplicate order id), so neither exists.
    let mut placing = Vec::new();
    for part in 0..4i64 {
        let (pool, url) = (pool.clone(), url.clone());
        placing.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            for order in (1..=200).filter(|o| o % 4 == part) {
                webhook_sender::place_order(&mut conn, &url, order, 100 * order)
                    .await
                    .unwrap();
            }
        }));
    }
    for p in placing {
        p.await.unwrap();
    }
    let mut conn = pool.acquire().await.unwrap();
    assert!(
        webhook_sender::place_order(&mut conn, &url, 99, 1).await.is_err(),
        "order 99 exists"
    );
    // Everything but the refused order is applied, each once.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while count(&pool, "SELECT count(*) FROM shop.orders WHERE announced_at IS NOT NULL").await < 199 {
        assert!(std::time::Instant::now() < deadline, "orders not announced in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dead = count(
        &pool,
        "SELECT count(*) FROM shop.webhooks WHERE status = 'failed' AND key = 'order-13'",
    )
    .await;
    assert_eq!(dead, 1, "a refused webhook is a dead letter");
    // The receiver is fixed; an operator replays it.
    state.lock().unwrap().refuse = None;
    let replayed = webhook_sender::queue()
        .replay(&mut conn, &ReplayFilter::key("order-13"))
        .await
        .unwrap();
    assert_eq!(replayed, 1);
    while count(&pool, "SELECT count(*) FROM shop.orders WHERE announced_at IS NOT NULL").await < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the replayed order was not announced"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in &stats {
        s.request_stop();
    }
    for t in serving {
        t.await.unwrap().unwrap();
    }
    let (mut applied, repeated) = {
        let s = state.lock().unwrap();
        (s.applied.clone(), s.calls.values().any(|c| *c > 1))
    };
    applied.sort_unstable();
    assert_eq!(applied, (1..=200).collect::<Vec<i64>>(), "each order applied once");
    assert!(repeated, "the faults made some calls repeat");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM shop.webhooks WHERE status <> 'settled'").await,
        0
    );
    // A 429 spent no attempt: order 7's webhook settled on its first counted attempt.
    assert_eq!(
        count(
            &pool,
            "SELECT (attempt - attempt_base)::bigint FROM shop.webhooks WHERE key = 'order-7'"
        )
        .await,
        1
    );
    drop(conn);
    pool.close().await;
}
