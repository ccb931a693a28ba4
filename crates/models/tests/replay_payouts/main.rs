//! The payouts model's counterexamples, replayed against the real database:
//! `settled serve`'s real handlers (two servers, each with its own pool, on
//! loopback ports), the real delivery handler (`Deliver`) served by the
//! engine's leased serve and paying through the provider simulator, the
//! real `move_payout`, `apply_word` and `debit_for_payout`. Each test first
//! asks the model for its counterexample and checks that its actions are
//! the steps the replay takes, in order; then it runs those steps twice:
//! with the guards the model removed left out (a hand-written statement,
//! and where the database holds the guard, a test database without it),
//! the model's bad state appears in the database or at the provider; with
//! the real code it does not.
//!
//! The traces are `settled-models --counterexamples`.

#[path = "../common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{payments_to, pool, provider_sim, set_faults, Point, Script, Stops};
use reqwest::StatusCode;
use serde_json::{json, Value};
use settled::payouts::deliver::{Deliver, Delivered};
use settled::payouts::limiter::{Limiter, Limits};
use settled::payouts::poll::{poll, Polling};
use settled::payouts::word::word_of;
use settled::provider::{EventType, HttpProvider, Payment, PayoutProvider, WebhookEvent};
use settled_engine::RetryPolicy;
use settled_engine::{ClaimedJob, HandlerError, LeaseConfig, LeasedJobHandler, ServeConfig, ServeStats};
use settled_models::suite::{self, Counterexample};
use sqlx::{PgConnection, PgPool};

mod keys;
mod returns;
mod webhooks;

const CREATOR: &str = "0x00000000000000000000000000000000000000c1";
const BALANCE: i64 = 1_000;
const AMOUNT: i64 = 100;
const API_TOKEN: &str = "replay-token";
const WEBHOOK_SECRET: &str = "whsec-replay";

// ---- the model's side -------------------------------------------------

/// The model's counterexample, printed; its actions must be, in order,
/// the replay's steps (each a part of the action's line).
fn model_trace(found: Counterexample, steps: &[&str]) -> String {
    let trace = common::printed_trace(found);
    let actions: Vec<&str> = trace
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()) && !l.contains("(start)"))
        .collect();
    assert_eq!(
        actions.len(),
        steps.len(),
        "the model's trace has {} actions, the replay {} steps:\n{trace}",
        actions.len(),
        steps.len()
    );
    for (action, step) in actions.iter().zip(steps) {
        assert!(
            action.contains(step),
            "the model's step {action:?} is not the replay's {step:?}"
        );
    }
    trace
}

// ---- the database and the servers ------------------------------------

/// A migrated database with one creator holding [`BALANCE`].
async fn database() -> (settled_testkit::TestDb, PgPool) {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = pool(&db.url).await;
    settled::db::migrate(&pool).await.unwrap();
    sqlx::query("INSERT INTO settlement.creator_balance (creator, balance) VALUES ($1, $2)")
        .bind(CREATOR)
        .bind(BALANCE)
        .execute(&pool)
        .await
        .unwrap();
    (db, pool)
}

/// A `settled serve` of its own pool on a loopback port, its idempotency
/// keys locked for `key_lock`; returns its base URL.
async fn server(url: &str, key_lock: Duration) -> String {
    let mut state = settled::api::AppState::new(pool(url).await, pool(url).await);
    state.api_token = Some(Arc::from(API_TOKEN));
    state.webhook_secrets = Some(Arc::new(vec![WEBHOOK_SECRET.as_bytes().to_vec()]));
    state.idempotency.lock = key_lock;
    let limits = state.limits;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = settled::api::router(state);
    tokio::spawn(settled::api::server::run(listener, app, limits, std::future::pending()));
    base
}

async fn post(base: &str, path: &str, key: Option<&str>, body: Value) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(API_TOKEN)
        .json(&body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `POST /v1/payouts` of [`AMOUNT`] to [`CREATOR`] under `key`.
async fn post_payout(base: &str, key: &str, confirm: bool) -> (StatusCode, Value) {
    let body = json!({ "creator": CREATOR, "amount": AMOUNT.to_string(), "confirm": confirm });
    post(base, "/v1/payouts", Some(key), body).await
}

/// `POST /v1/provider-events` with `event`, signed as the provider signs.
async fn post_event(base: &str, event: &WebhookEvent) -> (StatusCode, Value) {
    let body = serde_json::to_vec(event).unwrap();
    let now = unix_now();
    let signature = settled::provider::signature::sign(WEBHOOK_SECRET.as_bytes(), now, &body);
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/provider-events"))
        .header(settled::provider::signature::SIGNATURE_HEADER, signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The event the provider sends for `payment` (as it is now).
fn event_of(payment: &Payment) -> WebhookEvent {
    WebhookEvent {
        id: format!("evt_{}_{}", payment.id, payment.status),
        r#type: EventType::for_status(payment.status).expect("a settled payment"),
        created: unix_now(),
        data: payment.clone(),
    }
}

/// The payout's (status, returns, balance).
async fn payout(pool: &PgPool, id: i64) -> (String, i64, i64) {
    sqlx::query_as(
        "SELECT p.status,
                (SELECT count(*) FROM settlement.payout_returns r WHERE r.payout_id = p.id),
                (SELECT balance::bigint FROM settlement.creator_balance WHERE creator = p.creator)
         FROM settlement.payouts p WHERE p.id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Waits until `n` backends wait for a lock (the requests under test are
/// inside their transactions, queued behind the test's).
async fn lock_waiters(pool: &PgPool, n: i64) {
    // Up to a minute: HTTP requests reach their lock slowly on a loaded machine.
    for _ in 0..6000 {
        let waiting = count(
            pool,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await;
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("waited too long for {n} transactions to queue on the lock");
}

// ---- delivery ----------------------------------------------------------

/// The provider's payment under `key`, once it is no longer pending.
async fn settled_payment(sim: &str, key: &str) -> Payment {
    let provider = HttpProvider::new(sim, Duration::from_secs(5)).unwrap();
    for _ in 0..3000 {
        if let Some(payment) = provider.lookup(key).await.unwrap() {
            if payment.status.is_final() {
                return payment;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the provider never settled {key}");
}

/// The real delivery handler, calling the simulator.
fn deliver(pool: &PgPool, sim: &str) -> Deliver<HttpProvider> {
    let limiter = Arc::new(Limiter::new(pool.clone(), Limits::default()));
    Deliver::new(
        HttpProvider::new(sim, Duration::from_secs(5)).unwrap(),
        pool.clone(),
        limiter,
    )
}

/// One delivery worker: the engine's leased serve of the delivery queue,
/// one job at a time, leases that outlive the test (expired in SQL when
/// the trace says so), never rescuing by itself.
fn delivery_worker<H: LeasedJobHandler>(
    pool: &PgPool,
    handler: Arc<H>,
) -> (tokio::task::JoinHandle<()>, Arc<ServeStats>) {
    let stats = Arc::new(ServeStats::default());
    let cfg = ServeConfig {
        concurrency: 1,
        batch: 1,
        wake: settled_engine::continuous::Wake::Poll,
        poll: Duration::from_millis(20),
        retry: RetryPolicy {
            max_attempts: 25,
            backoff_base_ms: 1,
            backoff_cap_ms: 1,
        },
        lease: LeaseConfig {
            ttl: Duration::from_secs(600),
            rescue_interval: Duration::from_secs(3600),
            shutdown_grace: Duration::from_secs(1),
            calls_in_flight: 1,
        },
        retention: None,
        ..ServeConfig::default()
    };
    let (pool, served) = (pool.clone(), stats.clone());
    let task = tokio::spawn(async move {
        let queue = Arc::new(settled::payouts::delivery_queue());
        settled_engine::serve_leased(&pool, queue, handler, cfg, served)
            .await
            .unwrap();
    });
    (task, stats)
}

/// Stops a delivery worker and waits for it.
async fn stop(worker: (tokio::task::JoinHandle<()>, Arc<ServeStats>)) -> Arc<ServeStats> {
    worker.1.request_stop();
    worker.0.await.unwrap();
    worker.1
}

/// A delivery handler with named stops around `work`: at each point in
/// `stops` it reports (point, the claim) and waits to be let go.
struct Scripted<H> {
    inner: H,
    stops: Stops<ClaimedJob>,
}

/// Wraps `inner`, stopping at `points`.
fn scripted<H>(inner: H, points: &[Point]) -> (Arc<Scripted<H>>, Script<ClaimedJob>) {
    let (stops, script) = common::stops(points);
    (Arc::new(Scripted { inner, stops }), script)
}

impl<H: LeasedJobHandler> LeasedJobHandler for Scripted<H> {
    type Output = H::Output;

    async fn work(&self, job: &ClaimedJob) -> Result<H::Output, HandlerError> {
        self.stops.at(Point::Calling, job).await;
        let worked = self.inner.work(job).await;
        self.stops.at(Point::Called, job).await;
        worked
    }

    async fn complete(&self, tx: &mut PgConnection, done: &[(ClaimedJob, H::Output)]) -> Result<(), HandlerError> {
        self.inner.complete(tx, done).await
    }
}

/// The delivery handler with the guard left out: the provider key is
/// derived from the attempt as well as the payout, so each claim's call is
/// a new payment. Everything else is `Deliver`'s.
struct KeyPerAttempt {
    real: Deliver<HttpProvider>,
    provider: HttpProvider,
    pool: PgPool,
}

impl LeasedJobHandler for KeyPerAttempt {
    type Output = Delivered;

    async fn work(&self, job: &ClaimedJob) -> Result<Delivered, HandlerError> {
        let (status, amount, key): (String, String, String) =
            sqlx::query_as("SELECT status, amount::text, provider_key FROM settlement.payouts WHERE id = $1::bigint")
                .bind(&job.key)
                .fetch_one(&self.pool)
                .await?;
        if status != "queued" {
            return Ok(Delivered::Nothing);
        }
        let key = format!("{key}:attempt-{}", job.fence.get());
        let amount = settled::money::Amount::parse_decimal(&amount).unwrap();
        match self.provider.pay(&key, CREATOR, amount, Some(&job.key)).await {
            Ok((payment, _)) => Ok(Delivered::Word(word_of(&payment))),
            Err(e) => Err(HandlerError::Transient(e.to_string())),
        }
    }

    async fn complete(&self, tx: &mut PgConnection, done: &[(ClaimedJob, Delivered)]) -> Result<(), HandlerError> {
        self.real.complete(tx, done).await
    }
}

// ---- the replays -------------------------------------------------------

/// What a replay's run starts from: a database (without the guards
/// `unguard` drops), two servers on it, the provider simulator.
struct Setup {
    _db: settled_testkit::TestDb,
    pool: PgPool,
    servers: [String; 2],
    sim: String,
}

/// `unguard`: statements that take a guard out of the test database.
async fn setup(unguard: &[&str], key_lock: Duration) -> Setup {
    let (db, pool) = database().await;
    for sql in unguard {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    let servers = [server(&db.url, key_lock).await, server(&db.url, key_lock).await];
    Setup {
        pool,
        servers,
        sim: provider_sim().await,
        _db: db,
    }
}

/// The trigger `check_payout_change`, off: no transition is checked.
const NO_TRANSITIONS_TABLE: &str = "ALTER TABLE settlement.payouts DISABLE TRIGGER payouts_check_change";
/// `payout_returns`' primary key, dropped: a payout may be returned again.
const NO_RETURN_KEY: &str = "ALTER TABLE settlement.payout_returns DROP CONSTRAINT payout_returns_pkey";

/// A payout awaiting confirmation: (id, token).
async fn created_payout(base: &str, key: &str) -> (i64, String) {
    let (status, made) = post_payout(base, key, true).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    (
        made["id"].as_i64().unwrap(),
        made["confirm_token"].as_str().unwrap().to_string(),
    )
}

async fn status_of(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A blind write of a payout's state, what the code would run without the
/// conditional update: the trigger's return of funds still fires.
async fn write_blind(pool: &PgPool, id: i64, to: &str, reason: &str) {
    sqlx::query("UPDATE settlement.payouts SET status = $2, reason = $3 WHERE id = $1")
        .bind(id)
        .bind(to)
        .bind(reason)
        .execute(pool)
        .await
        .unwrap();
}

async fn provider_key(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT provider_key FROM settlement.payouts WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What became of a payout: its state, its returns, the balance, and the
/// payments the provider applied to the creator, by status.
#[derive(Debug, PartialEq)]
struct Ended {
    state: String,
    returns: i64,
    balance: i64,
    payments: Vec<String>,
}

impl Ended {
    /// A payout ended in `state`, its funds returned `returns` times, the
    /// creator's balance `balance`, the provider's payments in `payments`.
    fn of(state: &str, returns: i64, balance: i64, payments: &[&str]) -> Ended {
        Ended {
            state: state.into(),
            returns,
            balance,
            payments: payments.iter().map(|p| p.to_string()).collect(),
        }
    }
}

async fn ended(s: &Setup, id: i64) -> Ended {
    let (state, returns, balance) = payout(&s.pool, id).await;
    let payments = payments_to(&s.sim, CREATOR)
        .await
        .into_iter()
        .map(|p| p.status.to_string())
        .collect();
    Ended {
        state,
        returns,
        balance,
        payments,
    }
}
