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

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{payments_to, pool, provider_sim, set_faults, Point};
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
use tokio::sync::{mpsc, Mutex};

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
    stops: Vec<Point>,
    reached: mpsc::UnboundedSender<(Point, ClaimedJob)>,
    go: Mutex<mpsc::UnboundedReceiver<()>>,
}

/// The test's end of a [`Scripted`] handler.
struct Script {
    reached: mpsc::UnboundedReceiver<(Point, ClaimedJob)>,
    go: mpsc::UnboundedSender<()>,
}

impl Script {
    async fn reached(&mut self, point: Point) -> ClaimedJob {
        let (at, job) = tokio::time::timeout(Duration::from_secs(30), self.reached.recv())
            .await
            .expect("the worker reaches its stop in time")
            .expect("the worker is alive");
        assert_eq!(at, point, "stopped at {at:?}, expected {point:?}");
        job
    }

    fn go(&self) {
        self.go.send(()).unwrap();
    }
}

fn scripted<H>(inner: H, stops: &[Point]) -> (Arc<Scripted<H>>, Script) {
    let (reached_tx, reached_rx) = mpsc::unbounded_channel();
    let (go_tx, go_rx) = mpsc::unbounded_channel();
    let handler = Scripted {
        inner,
        stops: stops.to_vec(),
        reached: reached_tx,
        go: Mutex::new(go_rx),
    };
    (
        Arc::new(handler),
        Script {
            reached: reached_rx,
            go: go_tx,
        },
    )
}

impl<H: LeasedJobHandler> Scripted<H> {
    async fn stop(&self, point: Point, job: &ClaimedJob) {
        if self.stops.contains(&point) {
            self.reached.send((point, job.clone())).unwrap();
            self.go.lock().await.recv().await;
        }
    }
}

impl<H: LeasedJobHandler> LeasedJobHandler for Scripted<H> {
    type Output = H::Output;

    async fn work(&self, job: &ClaimedJob) -> Result<H::Output, HandlerError> {
        self.stop(Point::Calling, job).await;
        let worked = self.inner.work(job).await;
        self.stop(Point::Called, job).await;
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

/// The model's trace without the conditional update and the transitions
/// table (`settled-models --counterexamples`), step by step:
///
/// 1-2. `POST /v1/payouts` with `"confirm": true`: the payout `created`.
/// 3. the confirmation reads `created` (its write is step 5).
/// 4. the creator's cancel reads `created`, and decides to cancel.
/// 5. the confirmation writes `queued` (the real `POST ../confirm`: with
///    the payout still `created`, its conditional write and a blind one
///    write the same), the delivery job with it.
/// 6-7. w0 claims the job and calls the provider: accepted (w0 stops there).
/// 8. the provider pays the payment.
/// 9. its webhook's transaction reads `queued`.
/// 10. the cancel writes `cancelled` blind: the trigger returns the funds.
///
/// With the real code, each read is its write: the webhook moves the
/// payout to `paid` at step 9, and the cancel (`move_payout(id, [created],
/// cancelled)`) at step 10 moves nothing.
async fn paid_then_returned(guarded: bool) -> Ended {
    let unguard: &[&str] = if guarded { &[] } else { &[NO_TRANSITIONS_TABLE] };
    let s = setup(unguard, Duration::from_secs(60)).await;
    let [a, b] = &s.servers;
    let (id, token) = created_payout(a, "paid-then-returned").await;
    // 3-4. The reads (with the real code, part of the writes).
    assert_eq!(status_of(&s.pool, id).await, "created");
    // 5. The confirmation.
    let (status, body) = post(a, &format!("/v1/payouts/{id}/confirm"), None, json!({ "token": token })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // 6-7. w0 claims and calls; the provider accepts it.
    let (handler, mut w0) = scripted(deliver(&s.pool, &s.sim), &[Point::Called]);
    let worker = delivery_worker(&s.pool, handler);
    w0.reached(Point::Called).await;
    // 8. The provider pays it (the simulator settles at once).
    let paid = settled_payment(&s.sim, &provider_key(&s.pool, id).await).await;
    assert_eq!(paid.status.as_str(), "paid");
    // 9. Its webhook.
    if guarded {
        let (status, body) = post_event(b, &event_of(&paid)).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (StatusCode::OK, Some("applied")),
            "{body}"
        );
    } else {
        assert_eq!(status_of(&s.pool, id).await, "queued", "the webhook reads queued");
    }
    // 10. The cancel's write.
    if guarded {
        let (status, body) = post(a, &format!("/v1/payouts/{id}/cancel"), None, json!({})).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
    } else {
        write_blind(&s.pool, id, "cancelled", "cancelled by request").await;
    }
    let outcome = ended(&s, id).await;
    w0.go();
    stop(worker).await;
    outcome
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_conditional_update_and_the_transitions_table_a_paid_payout_is_returned() {
    model_trace(
        suite::without_state_condition_and_transitions(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "POST /v1/payouts/0/confirm",
            "POST /v1/payouts/0/cancel",
            "Confirm writes payout 0 Queued",
            "w0 claim_leased",
            "w0 work: provider pay(key) answers Accepted",
            "provider: payment 0 paid",
            "POST /v1/provider-events (e0)",
            "Creator writes payout 0 Cancelled (blind)",
        ],
    );
    let unguarded = paid_then_returned(false).await;
    assert_eq!(
        unguarded,
        Ended {
            state: "cancelled".into(),
            returns: 1,
            balance: BALANCE,
            payments: vec!["paid".into()],
        },
        "the provider paid the creator, and the funds came back too"
    );
    let real = paid_then_returned(true).await;
    assert_eq!(
        real,
        Ended {
            state: "paid".into(),
            returns: 0,
            balance: BALANCE - AMOUNT,
            payments: vec!["paid".into()],
        }
    );
}

/// The model's trace without the conditional update, the transitions
/// table and the return's key:
///
/// 1-5. as above: created, the confirmation's read, the cancel's read
///    (`created`), the confirmation's write (`queued`, the job).
/// 6-7. w0 claims and calls: accepted (w0 stops there).
/// 8. the provider fails the payment.
/// 9. its webhook (`payment.failed`) reads `queued` and decides `failed`.
/// 10. the cancel writes `cancelled` blind: funds returned.
/// 11. the webhook writes `failed` blind: funds returned again.
///
/// With the real code the webhook moves the payout to `failed` (funds
/// returned) at step 9 and the cancel moves nothing at step 10.
async fn returned_twice(guarded: bool) -> Ended {
    let unguard: &[&str] = if guarded {
        &[]
    } else {
        &[NO_TRANSITIONS_TABLE, NO_RETURN_KEY]
    };
    let s = setup(unguard, Duration::from_secs(60)).await;
    set_faults(&s.sim, json!({ "failure_rate": 1.0 })).await;
    let [a, b] = &s.servers;
    let (id, token) = created_payout(a, "returned-twice").await;
    // 3-4. The reads.
    assert_eq!(status_of(&s.pool, id).await, "created");
    // 5. The confirmation.
    let (status, body) = post(a, &format!("/v1/payouts/{id}/confirm"), None, json!({ "token": token })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // 6-7. w0 claims and calls.
    let (handler, mut w0) = scripted(deliver(&s.pool, &s.sim), &[Point::Called]);
    let worker = delivery_worker(&s.pool, handler);
    w0.reached(Point::Called).await;
    // 8. The provider fails it.
    let failed = settled_payment(&s.sim, &provider_key(&s.pool, id).await).await;
    assert_eq!(failed.status.as_str(), "failed");
    let event = event_of(&failed);
    if guarded {
        // 9. The webhook, read and written at once.
        let (status, body) = post_event(b, &event).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (StatusCode::OK, Some("applied")),
            "{body}"
        );
        // 10. The cancel.
        let (status, body) = post(a, &format!("/v1/payouts/{id}/cancel"), None, json!({})).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
    } else {
        // 9. The webhook's transaction reads queued: it will write failed.
        let mut webhook = s.pool.begin().await.unwrap();
        let read: String = sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *webhook)
            .await
            .unwrap();
        assert_eq!(read, "queued");
        // 10. The cancel's blind write.
        write_blind(&s.pool, id, "cancelled", "cancelled by request").await;
        // 11. The webhook's blind write, and its event.
        write_event_blind(&mut webhook, id, "failed", &event).await;
        webhook.commit().await.unwrap();
    }
    let outcome = ended(&s, id).await;
    w0.go();
    stop(worker).await;
    outcome
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_state_guards_a_payout_is_returned_twice() {
    model_trace(
        suite::without_state_guards(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "POST /v1/payouts/0/confirm",
            "POST /v1/payouts/0/cancel",
            "Confirm writes payout 0 Queued",
            "w0 claim_leased",
            "w0 work: provider pay(key) answers Accepted",
            "provider: payment 0 failed",
            "POST /v1/provider-events (e0)",
            "Creator writes payout 0 Cancelled (blind)",
            "Webhook(0) writes payout 0 Failed (blind)",
        ],
    );
    let unguarded = returned_twice(false).await;
    assert_eq!(
        unguarded,
        Ended {
            state: "failed".into(),
            returns: 2,
            balance: BALANCE + AMOUNT,
            payments: vec!["failed".into()],
        },
        "returned twice: the balance is more than it was before the payout"
    );
    let real = returned_twice(true).await;
    assert_eq!(
        real,
        Ended {
            state: "failed".into(),
            returns: 1,
            balance: BALANCE,
            payments: vec!["failed".into()],
        }
    );
}

/// The model's trace without the return's guards (the conditional update,
/// the transitions table, the return's key), step by step:
///
/// 1-2. `POST /v1/payouts`: queued, its job.
/// 3-4. w0 claims the job and calls the provider: accepted (w0 stops there).
/// 5. the provider pays the payment, and sends `payment.paid` (e0).
/// 6. its bank returns it: `payment.returned` (e0r).
/// 7. e0's transaction reads `queued`, and decides paid.
/// 8. e0r's transaction reads `queued`, and decides returned.
/// 9. e0r writes `returned` blind: the trigger returns the funds.
/// 10. e0 writes `paid` blind, over the return.
/// 11-12. the look-up of paid payouts reads `paid`, the provider says
///    returned: it writes `returned` blind, and the funds come back again.
///
/// With the real code each read is its write (`apply_provider_word`, one
/// conditional update along `provider_word_moves`): e0 moves the payout
/// paid at step 7, e0r returned at step 8 (funds back once), and the
/// look-up finds nothing to do.
async fn returned_before_paid(guarded: bool) -> Ended {
    let unguard: &[&str] = if guarded {
        &[]
    } else {
        &[NO_TRANSITIONS_TABLE, NO_RETURN_KEY]
    };
    let s = setup(unguard, Duration::from_secs(60)).await;
    // 1-2. The payout.
    let (status, made) = post_payout(&s.servers[0], "returned-before-paid", false).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_i64().unwrap();
    // 3-4. w0 claims and calls; the provider accepts it.
    let (handler, mut w0) = scripted(deliver(&s.pool, &s.sim), &[Point::Called]);
    let worker = delivery_worker(&s.pool, handler);
    w0.reached(Point::Called).await;
    // 5. The provider pays it (the simulator settles at once).
    let paid = settled_payment(&s.sim, &provider_key(&s.pool, id).await).await;
    assert_eq!(paid.status.as_str(), "paid");
    // 6. Its bank returns it.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payments/{}/return", s.sim, paid.id))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let returned: Payment = r.json().await.unwrap();
    assert_eq!(returned.status.as_str(), "returned");
    let (e0, e0r) = (event_of(&paid), event_of(&returned));
    if guarded {
        // 7-10. Each event read and written at once.
        for (event, outcome) in [(&e0, "applied"), (&e0r, "applied")] {
            let (status, body) = post_event(&s.servers[1], event).await;
            assert_eq!(
                (status, body["outcome"].as_str()),
                (StatusCode::OK, Some(outcome)),
                "{body}"
            );
        }
        // 11-12. The look-up of paid payouts: nothing is paid any more.
        let polling = Polling {
            sent_after: Duration::ZERO,
            paid_every: Duration::ZERO,
            returns_watch: Duration::from_secs(3600),
            key_window: Duration::from_secs(3600),
        };
        let rail = HttpProvider::new(&s.sim, Duration::from_secs(5)).unwrap();
        let looked_up = poll(&s.pool, &rail, &polling, 10).await.unwrap();
        assert_eq!(looked_up, 0, "a returned payout is looked up no more");
    } else {
        // 7-8. Both events' transactions read queued.
        let (mut paid_tx, mut returned_tx) = (s.pool.begin().await.unwrap(), s.pool.begin().await.unwrap());
        for tx in [&mut paid_tx, &mut returned_tx] {
            let read: String = sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
                .bind(id)
                .fetch_one(&mut **tx)
                .await
                .unwrap();
            assert_eq!(read, "queued");
        }
        // 9. e0r's blind write, and its event: funds returned.
        write_event_blind(&mut returned_tx, id, "returned", &e0r).await;
        returned_tx.commit().await.unwrap();
        // 10. e0's blind write over it.
        write_event_blind(&mut paid_tx, id, "paid", &e0).await;
        paid_tx.commit().await.unwrap();
        // 11-12. The look-up reads paid; the provider says returned.
        assert_eq!(status_of(&s.pool, id).await, "paid");
        write_blind(&s.pool, id, "returned", "returned: returned_by_bank (poll)").await;
    }
    let outcome = ended(&s, id).await;
    w0.go();
    stop(worker).await;
    outcome
}

/// A webhook's blind write of `to`, and its event stored, on `tx`.
async fn write_event_blind(tx: &mut sqlx::PgConnection, id: i64, to: &str, event: &WebhookEvent) {
    sqlx::query("UPDATE settlement.payouts SET status = $2, reason = $3 WHERE id = $1")
        .bind(id)
        .bind(to)
        .bind(format!("{to} (event {})", event.id))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO settlement.provider_events (id, type, created, provider_key, payout_id, outcome, body)
         VALUES ($1, $2, $3, $4, $5, 'applied', $6) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&event.id)
    .bind(event.r#type.as_str())
    .bind(event.created)
    .bind(&event.data.idempotency_key)
    .bind(id)
    .bind(serde_json::to_value(event).unwrap())
    .execute(&mut *tx)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_returns_guards_a_return_gives_the_money_back_twice() {
    model_trace(
        suite::without_return_guards(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "w0 claim_leased",
            "w0 work: provider pay(key) answers Accepted",
            "provider: payment 0 paid, webhook e0 sent",
            "provider: payment 0 returned, webhook e0r sent",
            "POST /v1/provider-events (e0)",
            "POST /v1/provider-events (e0r)",
            "Webhook(1) writes payout 0 Returned (blind)",
            "Webhook(0) writes payout 0 Paid (blind)",
            "poll looks up payout 0",
            "Poll writes payout 0 Returned (blind)",
        ],
    );
    let unguarded = returned_before_paid(false).await;
    assert_eq!(
        unguarded,
        Ended {
            state: "returned".into(),
            returns: 2,
            balance: BALANCE + AMOUNT,
            payments: vec!["returned".into()],
        },
        "the provider took the payment back once, and the balance got it twice"
    );
    let real = returned_before_paid(true).await;
    assert_eq!(
        real,
        Ended {
            state: "returned".into(),
            returns: 1,
            balance: BALANCE,
            payments: vec!["returned".into()],
        }
    );
}

/// The model's trace without the token's condition and the conditional
/// update: two confirmations read `created` (3, 4), then each writes
/// (5, 6): both commit, the token redeemed twice. Returns how many
/// confirmations succeeded.
async fn confirmed_twice(guarded: bool) -> usize {
    let s = setup(&[], Duration::from_secs(60)).await;
    let [a, b] = &s.servers;
    let (id, token) = created_payout(a, "confirmed-twice").await;
    if guarded {
        // Both requests inside their transactions at once: held behind the
        // test's lock on the token until both wait.
        let mut hold = s.pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM settled_engine.once_tokens WHERE id = $1::uuid FOR UPDATE")
            .bind(&token)
            .execute(&mut *hold)
            .await
            .unwrap();
        let confirm = |base: String| {
            let token = token.clone();
            tokio::spawn(async move {
                post(
                    &base,
                    &format!("/v1/payouts/{id}/confirm"),
                    None,
                    json!({ "token": token }),
                )
                .await
            })
        };
        let (first, second) = (confirm(a.clone()), confirm(b.clone()));
        lock_waiters(&s.pool, 2).await;
        hold.rollback().await.unwrap();
        let answers = [first.await.unwrap(), second.await.unwrap()];
        return answers.iter().filter(|(status, _)| *status == StatusCode::OK).count();
    }
    // 3-4. Both read created.
    let mut confirmations = Vec::new();
    for _ in 0..2 {
        let mut tx = s.pool.begin().await.unwrap();
        let read: String = sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(read, "created");
        confirmations.push(tx);
    }
    // 5-6. Each redeems the token (its expiry checked, not its status) and
    // writes queued blind, with the job.
    let mut succeeded = 0;
    for mut tx in confirmations {
        let redeemed = sqlx::query(
            "UPDATE settled_engine.once_tokens SET status = 'completed', completed_at = now()
             WHERE id = $1::uuid AND purpose = $2 AND expires_at > now()",
        )
        .bind(&token)
        .bind(settled::payouts::CONFIRMATION_PURPOSE)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
        let moved = sqlx::query("UPDATE settlement.payouts SET status = 'queued', reason = 'confirmed' WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected();
        sqlx::query("INSERT INTO settlement.payout_jobs (payout_id) VALUES ($1) ON CONFLICT (payout_id) DO NOTHING")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        succeeded += usize::from(redeemed == 1 && moved == 1);
    }
    succeeded
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_token_and_state_conditions_two_confirmations_both_redeem() {
    model_trace(
        suite::without_token_conditions(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "POST /v1/payouts/0/confirm",
            "POST /v1/payouts/0/confirm",
            "Confirm writes payout 0 Queued (blind)",
            "Confirm writes payout 0 Queued (blind)",
        ],
    );
    assert_eq!(confirmed_twice(false).await, 2, "one token, two confirmations");
    assert_eq!(confirmed_twice(true).await, 1);
}

/// What the event replay left: the event's rows, and the payout.
#[derive(Debug, PartialEq)]
struct Recorded {
    events: Vec<String>,
    state: String,
    returns: i64,
    balance: i64,
}

/// The webhook's transaction with the unique event id left out: the real
/// `apply_word`, then the event stored without `ON CONFLICT`.
async fn record_without_event_id(pool: PgPool, event: WebhookEvent) {
    let mut tx = pool.begin().await.unwrap();
    let id = settled::payouts::by_provider_key(&mut tx, &event.data.idempotency_key)
        .await
        .unwrap()
        .expect("the payout");
    let applied = settled::payouts::apply_word(
        &mut tx,
        id,
        &word_of(&event.data),
        settled::payouts::Source::Webhook,
        Some(&event.id),
    )
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO settlement.provider_events (id, type, created, provider_key, payout_id, outcome, body)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&event.id)
    .bind(event.r#type.as_str())
    .bind(event.created)
    .bind(&event.data.idempotency_key)
    .bind(id)
    .bind(applied.as_str())
    .bind(serde_json::to_value(&event).unwrap())
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// The model's trace without the unique event id:
///
/// 1-2. `POST /v1/payouts`: the payout `queued`, its job.
/// 3-5. w0 claims, the provider accepts, w0 records `sent`.
/// 6. the provider fails the payment and sends `payment.failed`.
/// 7. the network duplicates it.
/// 8-9. both deliveries are received, on two servers at once: both
///    transactions wait behind the test's lock on the payout, then run
///    one after the other, as the model's two steps.
async fn duplicated_webhook(guarded: bool) -> Recorded {
    let unguard: &[&str] = if guarded {
        &[]
    } else {
        &["ALTER TABLE settlement.provider_events DROP CONSTRAINT provider_events_pkey"]
    };
    let s = setup(unguard, Duration::from_secs(60)).await;
    set_faults(&s.sim, json!({ "failure_rate": 1.0 })).await;
    let (status, made) = post_payout(&s.servers[0], "duplicated-webhook", false).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_i64().unwrap();
    // 3-5. Delivered: sent.
    let worker = delivery_worker(&s.pool, Arc::new(deliver(&s.pool, &s.sim)));
    // 6. The provider fails it.
    let failed = settled_payment(&s.sim, &provider_key(&s.pool, id).await).await;
    for _ in 0..500 {
        if status_of(&s.pool, id).await == "sent" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status_of(&s.pool, id).await, "sent");
    stop(worker).await;
    // 7-9. The event twice, at once.
    let event = event_of(&failed);
    let mut hold = s.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settlement.payouts WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *hold)
        .await
        .unwrap();
    let deliveries: Vec<_> = s
        .servers
        .iter()
        .map(|base| {
            let (base, event, pool) = (base.clone(), event.clone(), s.pool.clone());
            tokio::spawn(async move {
                if guarded {
                    let (status, body) = post_event(&base, &event).await;
                    assert_eq!(status, StatusCode::OK, "{body}");
                } else {
                    record_without_event_id(pool, event).await;
                }
            })
        })
        .collect();
    lock_waiters(&s.pool, 2).await;
    hold.rollback().await.unwrap();
    for delivery in deliveries {
        delivery.await.unwrap();
    }
    let events: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM settlement.provider_events WHERE id = $1 ORDER BY outcome")
            .bind(&event.id)
            .fetch_all(&s.pool)
            .await
            .unwrap();
    let (state, returns, balance) = payout(&s.pool, id).await;
    Recorded {
        events,
        state,
        returns,
        balance,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_unique_event_id_a_duplicated_webhook_is_recorded_twice() {
    model_trace(
        suite::without_event_id(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "w0 claim_leased",
            "w0 work: provider pay(key) answers Accepted",
            "w0 complete_fenced + Deliver::complete",
            "provider: payment 0 failed",
            "network duplicates webhook e0",
            "POST /v1/provider-events (e0)",
            "POST /v1/provider-events (e0)",
        ],
    );
    let unguarded = duplicated_webhook(false).await;
    assert_eq!(
        unguarded,
        Recorded {
            events: vec!["already".into(), "applied".into()],
            state: "failed".into(),
            returns: 1,
            balance: BALANCE,
        },
        "the event is recorded twice; the conditional update still returns the funds once"
    );
    let real = duplicated_webhook(true).await;
    assert_eq!(
        real,
        Recorded {
            events: vec!["applied".into()],
            state: "failed".into(),
            returns: 1,
            balance: BALANCE,
        }
    );
}

/// The model's trace without the request's key (its claim and the unique
/// `payouts.idempotency_key`):
///
/// 1-2. `POST /v1/payouts` with key k0, then the same again (the client
///    timed out) through the other server.
/// 3-4. each reads no payout under k0.
/// 5-6. each debits and makes a payout.
///
/// With the real code, the servers hold keys for 1 ms (standing for a first
/// request paused past its `locked_until`), so the second takes the key
/// over; both requests read no payout and queue behind the test's lock on
/// the balance; released, the first debits, makes its payout and stores its
/// answer (201); the second's insert meets the unique key and rolls back
/// (503), and its retry gets the first's payout. Returns (payouts made
/// under the key, the balance).
async fn posted_twice(guarded: bool) -> (i64, i64) {
    let unguard: &[&str] = if guarded {
        &[]
    } else {
        // The provider key is derived from the request key and unique too
        // (migration 20261203000701), so it backs the request key up and
        // goes with it.
        &[
            "ALTER TABLE settlement.payouts DROP CONSTRAINT payouts_idempotency_key_key",
            "DROP INDEX settlement.payouts_provider_key",
        ]
    };
    let s = setup(unguard, Duration::from_millis(1)).await;
    let key = "posted-twice";
    let mut hold = s.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settlement.creator_balance WHERE creator = $1 FOR UPDATE")
        .bind(CREATOR)
        .execute(&mut *hold)
        .await
        .unwrap();
    let request = |i: usize| {
        let (base, pool) = (s.servers[i].clone(), s.pool.clone());
        tokio::spawn(async move {
            if guarded {
                return post_payout(&base, key, false).await;
            }
            // pay() without the key's claim, and with no unique key.
            let earlier: Option<i64> =
                sqlx::query_scalar("SELECT id FROM settlement.payouts WHERE idempotency_key = $1")
                    .bind(key)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
            assert_eq!(earlier, None);
            let mut tx = pool.begin().await.unwrap();
            let outcome: String = sqlx::query_scalar(
                "SELECT outcome FROM settlement.debit_for_payout($1, $2::numeric, $3, $4, NULL, NULL, NULL)",
            )
            .bind(CREATOR)
            .bind(AMOUNT.to_string())
            .bind(key)
            .bind("POST /v1/payouts replay")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            assert_eq!(outcome, "paid");
            (StatusCode::CREATED, Value::Null)
        })
    };
    // The first request reaches the lock, then the second.
    let mut answers = Vec::new();
    for i in 0..2 {
        answers.push(request(i));
        lock_waiters(&s.pool, i as i64 + 1).await;
    }
    hold.rollback().await.unwrap();
    let mut statuses = Vec::new();
    for answer in answers {
        statuses.push(answer.await.unwrap());
    }
    if guarded {
        let got: Vec<(StatusCode, Option<&str>)> = statuses.iter().map(|(s, b)| (*s, b["type"].as_str())).collect();
        // The second failed on the database (its insert), not by waiting
        // on the lock (that would be database-busy).
        assert_eq!(
            got,
            [
                (StatusCode::CREATED, None),
                (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/database-unavailable"))
            ],
            "{statuses:?}"
        );
        let (status, again) = post_payout(&s.servers[1], key, false).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "the retry is answered with the first payout: {again}"
        );
    }
    let made = count(
        &s.pool,
        "SELECT count(*) FROM settlement.payouts WHERE idempotency_key = 'posted-twice'",
    )
    .await;
    let balance = count(&s.pool, "SELECT balance::bigint FROM settlement.creator_balance").await;
    (made, balance)
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_request_key_two_posts_make_two_payouts() {
    model_trace(
        suite::without_request_key(),
        &[
            "POST /v1/payouts (key k0)",
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "pay() k0",
            "debit_for_payout + finish (after reading none)",
            "debit_for_payout + finish (after reading none)",
        ],
    );
    assert_eq!(
        posted_twice(false).await,
        (2, BALANCE - 2 * AMOUNT),
        "one request, two debits"
    );
    assert_eq!(posted_twice(true).await, (1, BALANCE - AMOUNT));
}

/// The model's trace without the payout's provider key:
///
/// 1-2. `POST /v1/payouts`: queued, its job.
/// 3. w0 claims the job and loads the payout.
/// 4. w0 stops (before its call).
/// 5. the database clock passes its lease (made so in SQL).
/// 6. w0 may run again (it calls at step 10).
/// 7. the rescue takes the job back.
/// 8-9. w1 claims it (attempt 2) and calls: accepted.
/// 10. w0 calls.
///
/// Then w0's completion is refused by the fence and w1's records the
/// answer. Returns the payments the provider applied, the zombie's fence
/// rejections and the payout's state.
async fn zombie_and_rescuer<H, F>(handler: F) -> (usize, u64, String)
where
    H: LeasedJobHandler,
    F: Fn(&PgPool, &str) -> H,
{
    let s = setup(&[], Duration::from_secs(60)).await;
    let (status, made) = post_payout(&s.servers[0], "zombie-and-rescuer", false).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_i64().unwrap();
    // 3-4. w0 claims, loads, stops.
    let (zombie, mut w0) = scripted(handler(&s.pool, &s.sim), &[Point::Calling]);
    let w0_worker = delivery_worker(&s.pool, zombie);
    assert_eq!(w0.reached(Point::Calling).await.fence.get(), 1);
    // 5. Its lease passes.
    sqlx::query("UPDATE settlement.payout_jobs SET lease_until = now() - interval '1 second' WHERE payout_id = $1")
        .bind(id)
        .execute(&s.pool)
        .await
        .unwrap();
    // 7. The rescue.
    let policy = RetryPolicy {
        max_attempts: 25,
        backoff_base_ms: 1,
        backoff_cap_ms: 1,
    };
    // w0's serve runs a rescue when it starts; late under load, it may take
    // the rescuer's lock, or this very job, first: either is the rescue.
    let queue = settled::payouts::delivery_queue();
    let mut job = (String::new(), 0);
    for _ in 0..500 {
        settled_engine::continuous::serve::rescue_once(&s.pool, &queue, &policy)
            .await
            .unwrap();
        job = sqlx::query_as("SELECT status, attempt FROM settlement.payout_jobs WHERE payout_id = $1")
            .bind(id)
            .fetch_one(&s.pool)
            .await
            .unwrap();
        if job.0 != "processing" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(job, ("eligible".to_string(), 1), "the rescue gives the job back");
    // 8-9. w1 claims (attempt 2) and calls.
    let (live, mut w1) = scripted(handler(&s.pool, &s.sim), &[Point::Called]);
    let w1_worker = delivery_worker(&s.pool, live);
    assert_eq!(w1.reached(Point::Called).await.fence.get(), 2);
    // 10. w0 calls, then completes: refused by the fence.
    w0.go();
    for _ in 0..500 {
        if w0_worker.1.fence_rejections.load(Ordering::Relaxed) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rejected = stop(w0_worker).await.fence_rejections.load(Ordering::Relaxed);
    // w1 completes.
    w1.go();
    for _ in 0..500 {
        if status_of(&s.pool, id).await != "queued" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop(w1_worker).await;
    (
        payments_to(&s.sim, CREATOR).await.len(),
        rejected,
        status_of(&s.pool, id).await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_provider_key_a_zombie_and_its_rescuer_pay_twice() {
    model_trace(
        suite::without_payout_key(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "w0 claim_leased",
            "w0 SIGSTOP",
            "clock passes job 0's lease_until",
            "w0 SIGCONT",
            "rescue_expired (job 0)",
            "w1 claim_leased",
            "w1 work: provider pay(key) answers Accepted",
            "w0 work: provider pay(key) answers Accepted",
        ],
    );
    let per_attempt = |pool: &PgPool, sim: &str| KeyPerAttempt {
        real: deliver(pool, sim),
        provider: HttpProvider::new(sim, Duration::from_secs(5)).unwrap(),
        pool: pool.clone(),
    };
    let (payments, rejected, state) = zombie_and_rescuer(per_attempt).await;
    assert_eq!(payments, 2, "with a key per attempt the provider pays the payout twice");
    assert_eq!(
        (rejected, state.as_str()),
        (1, "sent"),
        "while settled records one payment"
    );
    let (payments, rejected, state) = zombie_and_rescuer(deliver).await;
    assert_eq!(payments, 1, "the payout's key makes the zombie's call a replay");
    assert_eq!((rejected, state.as_str()), (1, "sent"));
}
