//! A continuous queue that is not settlement: an order and the webhook
//! announcing it commit in one transaction (the outbox), and leased workers
//! deliver each webhook with the job's key as its `Idempotency-Key`, so a
//! receiver that deduplicates by that key applies each order once, however
//! often a crash or a lost answer makes the call repeat.
//!
//! `cargo run -p settled-engine --example webhook_sender` uses
//! `DATABASE_URL`, or a throwaway private PostgreSQL when it is unset, and
//! a receiver of its own on 127.0.0.1.
//!
//! The queue `webhooks` lives on `shop.webhooks`, created by
//! [`settled_engine::Queue::table_sql`]. A receiver answering 429 or 5xx is
//! tried again later (a 429 without spending an attempt); any other 4xx
//! fails the webhook for good: a dead letter an operator can replay.

use std::sync::Arc;
use std::time::Duration;

use settled_engine::continuous::ServeConfig;
use settled_engine::{ClaimedJob, HandlerError, LeasedJobHandler, NewJob, Queue, ServeStats};
use sqlx::{Connection, PgConnection, PgPool};

/// The queue of webhooks.
pub(crate) fn queue() -> Queue {
    Queue::new("webhooks", "shop.webhooks").expect("valid names")
}

/// What a webhook carries, as its job's payload.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Webhook {
    /// Where it goes.
    pub url: String,
    /// The order it announces.
    pub order: i64,
    /// The amount, in cents (an exact integer).
    pub amount_cents: i64,
}

/// Creates the engine's tables, the shop's orders and the queue's table.
pub(crate) async fn install(pool: &PgPool) -> anyhow::Result<()> {
    settled_engine::migrate(pool).await?;
    let mut conn = pool.acquire().await?;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('shop.webhooks') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        let mut tx = conn.begin().await?;
        sqlx::query("CREATE SCHEMA shop").execute(&mut *tx).await?;
        sqlx::query(
            "CREATE TABLE shop.orders (id bigint PRIMARY KEY, amount_cents bigint NOT NULL,
                                       announced_at timestamptz)",
        )
        .execute(&mut *tx)
        .await?;
        queue().create_table(&mut tx).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Places an order: the order and its webhook commit together, or neither.
pub(crate) async fn place_order(
    conn: &mut PgConnection,
    receiver: &str,
    order: i64,
    amount_cents: i64,
) -> anyhow::Result<()> {
    let mut tx = conn.begin().await?;
    sqlx::query("INSERT INTO shop.orders (id, amount_cents) VALUES ($1, $2)")
        .bind(order)
        .bind(amount_cents)
        .execute(&mut *tx)
        .await?;
    let hook = Webhook {
        url: format!("{receiver}/orders"),
        order,
        amount_cents,
    };
    queue()
        .enqueue(&mut tx, &NewJob::new(format!("order-{order}")).payload(&hook)?)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Delivers webhooks over HTTP.
pub(crate) struct Sender {
    client: reqwest::Client,
}

impl Sender {
    /// A sender whose calls give up after five seconds.
    pub(crate) fn new() -> anyhow::Result<Sender> {
        Ok(Sender {
            client: reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?,
        })
    }
}

impl LeasedJobHandler for Sender {
    type Output = ();

    async fn work(&self, job: &ClaimedJob) -> Result<(), HandlerError> {
        let hook: Webhook = job.payload_as()?;
        let answer = self
            .client
            .post(&hook.url)
            .header("Idempotency-Key", &job.key)
            .json(&hook)
            .send()
            .await
            .map_err(|e| HandlerError::Transient(format!("calling {}: {e}", hook.url)))?;
        let status = answer.status();
        match status.as_u16() {
            200..=299 => Ok(()),
            429 => Err(HandlerError::Snooze {
                after: Duration::from_secs(1),
                reason: "the receiver is rate limiting".into(),
            }),
            500..=599 => Err(HandlerError::Transient(format!("{} answered {status}", hook.url))),
            _ => Err(HandlerError::Permanent(format!("{} refused it: {status}", hook.url))),
        }
    }

    /// Marks the orders announced, with the jobs' completion.
    async fn complete(&self, tx: &mut PgConnection, done: &[(ClaimedJob, ())]) -> Result<(), HandlerError> {
        let orders: Vec<i64> = done
            .iter()
            .map(|(job, ())| job.payload_as::<Webhook>().map(|h| h.order))
            .collect::<Result<_, _>>()?;
        sqlx::query("UPDATE shop.orders SET announced_at = now() WHERE id = ANY($1)")
            .bind(orders)
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// Serves the queue with `loops` claim loops until `stats` is stopped.
pub(crate) async fn deliver(pool: &PgPool, loops: u32, stats: Arc<ServeStats>) -> anyhow::Result<()> {
    let cfg = ServeConfig {
        concurrency: loops,
        batch: 10,
        ..ServeConfig::default()
    };
    settled_engine::serve_leased(pool, Arc::new(queue()), Arc::new(Sender::new()?), cfg, stats).await?;
    Ok(())
}

/// A receiver for `main`: applies each order once per idempotency key.
#[allow(dead_code)]
async fn receiver() -> anyhow::Result<(String, Arc<std::sync::Mutex<std::collections::HashSet<String>>>)> {
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let keys = seen.clone();
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let keys = keys.clone();
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                keys.lock().expect("keys").insert(key.to_string());
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, seen))
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // DATABASE_URL, else a throwaway database dropped at the end.
    let (url, _db) = settled_testkit::TestDb::from_env_or_create().await?;
    let pool = PgPool::connect(&url).await?;
    install(&pool).await?;
    let (receiver, seen) = receiver().await?;
    let stats = Arc::new(ServeStats::default());
    let serving = tokio::spawn({
        let (pool, stats) = (pool.clone(), stats.clone());
        async move { deliver(&pool, 4, stats).await }
    });
    let mut conn = pool.acquire().await?;
    let first: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) + 1 FROM shop.orders")
        .fetch_one(&mut *conn)
        .await?;
    for order in first..first + 500 {
        place_order(&mut conn, &receiver, order, 1_999).await?;
    }
    while seen.lock().expect("keys").len() < 500 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stats.request_stop();
    serving.await??;
    let announced: i64 = sqlx::query_scalar("SELECT count(*) FROM shop.orders WHERE announced_at IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    println!("webhooks: 500 orders placed, {announced} announced in all, each once per key at the receiver");
    Ok(())
}
