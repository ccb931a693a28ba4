//! A paid payout the provider takes back (a bank's return), with real
//! processes: `settled serve` taking the provider's signed webhooks,
//! `settled deliver` sending and looking payouts up, the provider
//! simulator returning paid payments. Whatever the order the provider's
//! words arrive in (returned after paid, returned before paid, the same
//! return twice, a return only a look-up finds, `failed` after `paid` from
//! a provider without a returned status), the payout ends `returned` and
//! its amount is back on the creator's balance exactly once.

use crate::common;

use common::{wait_until, Deliverer, Env, ProviderSim, Server, PERIOD};
use serde_json::{json, Value};

const TOKEN: &str = "test-token";
const SECRET: &str = "whsec-returns";
const AMOUNT: &str = "1000";

/// A settled period, a server that takes webhooks, a simulator posting them.
async fn setup(sim_flags: &[&str]) -> (Env, Server, ProviderSim) {
    let env = Env::new().await;
    env.seed(20);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve_with(TOKEN, &["--provider-webhook-secret", SECRET]).await;
    let sim = ProviderSim::start(sim_flags);
    point_webhooks(&sim, &server).await;
    (env, server, sim)
}

async fn point_webhooks(sim: &ProviderSim, server: &Server) {
    sim.post_webhooks_to(server, SECRET).await;
}

/// A payout of [`AMOUNT`], with what it needs to be spoken of.
#[derive(Debug, Clone)]
struct Payout {
    id: i64,
    creator: String,
    key: String,
    /// The creator's balance before the payout was made.
    balance_before: String,
}

async fn balance(env: &Env, creator: &str) -> String {
    sqlx::query_scalar("SELECT balance::text FROM settlement.creator_balance WHERE creator = $1")
        .bind(creator)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// `n` payouts of [`AMOUNT`], one per creator with enough balance.
async fn make_payouts(env: &Env, server: &Server, n: i64) -> Vec<Payout> {
    let creators = common::creators_with_balance(env, n, AMOUNT).await;
    let mut made = Vec::new();
    for (i, creator) in creators.into_iter().enumerate() {
        let balance_before = balance(env, &creator).await;
        let id = common::create_payout(server, TOKEN, &format!("r-{i}"), &creator, AMOUNT).await;
        let key = common::provider_key_of(env, id).await;
        made.push(Payout {
            id,
            creator,
            key,
            balance_before,
        });
    }
    made
}

/// `settled deliver`, looking up payouts sent a second ago and paid ones
/// every second, with `extra` flags.
fn deliver(env: &Env, sim: &ProviderSim, extra: &[&str]) -> Deliverer {
    let mut args = common::QUICK_LOOKUPS.to_vec();
    args.extend_from_slice(extra);
    Deliverer(env.deliver(&sim.url, &args))
}

/// Delivers `payouts` to a simulator that keeps payments pending, until
/// each is `sent`; returns the provider's payment id of each.
async fn sent(env: &Env, sim: &ProviderSim, payouts: &[Payout]) -> Vec<String> {
    let deliverer = deliver(env, sim, &[]);
    wait_until(30, "the payouts sent", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE status = 'sent'")
            .await
            == payouts.len() as i64
    })
    .await;
    deliverer.stop();
    let mut ids = Vec::new();
    for p in payouts {
        ids.push(
            env.scalar_text(&format!(
                "SELECT provider_id FROM settlement.payouts WHERE id = {}",
                p.id
            ))
            .await,
        );
    }
    ids
}

/// A provider event about `payout`'s payment `payment`, of `kind`.
fn event(event_id: &str, kind: &str, payout: &Payout, payment: &str) -> Value {
    let status = kind.trim_start_matches("payment.");
    let reason = if status == "paid" {
        Value::Null
    } else {
        json!("account_closed")
    };
    json!({ "id": event_id, "type": kind, "created": 1, "data": {
        "id": payment, "idempotency_key": payout.key, "creator": payout.creator, "amount": AMOUNT,
        "status": status, "failure_reason": reason, "reference": payout.key } })
}

/// `event` signed and posted to `server`: its status and answer.
async fn post_event(server: &str, event: &Value) -> (u16, Value) {
    common::post_signed_event(server, SECRET, event).await
}

/// Posts `event` and requires the outcome `outcome`.
async fn expect_outcome(server: &Server, event: &Value, outcome: &str) {
    let (status, body) = post_event(&server.base, event).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some(outcome)),
        "{event}: {body}"
    );
}

/// Where payout `p` ended: its state, its returns, its creator's balance,
/// and the states its history went through.
#[derive(Debug, PartialEq)]
struct Ended {
    state: String,
    returns: i64,
    balance: String,
    path: Vec<String>,
}

async fn ended(env: &Env, p: &Payout) -> Ended {
    let (state, returns): (String, i64) = sqlx::query_as(
        "SELECT status, (SELECT count(*) FROM settlement.payout_returns r WHERE r.payout_id = p.id)
         FROM settlement.payouts p WHERE p.id = $1",
    )
    .bind(p.id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let path: Vec<String> =
        sqlx::query_scalar("SELECT to_state FROM settlement.payout_history WHERE payout_id = $1 ORDER BY id")
            .bind(p.id)
            .fetch_all(&env.pool)
            .await
            .unwrap();
    Ended {
        state,
        returns,
        balance: balance(env, &p.creator).await,
        path,
    }
}

/// `p` returned once: its funds back on the balance as before it was
/// made, along `path`.
fn returned_once(p: &Payout, path: &[&str]) -> Ended {
    Ended {
        state: "returned".into(),
        returns: 1,
        balance: p.balance_before.clone(),
        path: path.iter().map(|s| s.to_string()).collect(),
    }
}

/// Every payout check holds, and every unit that left a balance went out
/// as a payout or came back.
fn verify_payouts(env: &Env) {
    let out = env.run_ok(&["verify", "--payouts"]);
    assert!(out.contains("OK, every check holds"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paid_payout_the_provider_returns_is_returned_and_its_amount_credited_back_once() {
    let (env, server, sim) = setup(&["--settle-delay-ms", "86400000"]).await;
    let payouts = make_payouts(&env, &server, 1).await;
    let p = &payouts[0];
    let payment = &sent(&env, &sim, &payouts).await[0];
    expect_outcome(&server, &event("ev-paid", "payment.paid", p, payment), "applied").await;
    let paid = ended(&env, p).await;
    assert_eq!((paid.state.as_str(), paid.returns), ("paid", 0));
    assert_ne!(paid.balance, p.balance_before, "the payout's amount left the balance");
    expect_outcome(
        &server,
        &event("ev-returned", "payment.returned", p, payment),
        "applied",
    )
    .await;
    assert_eq!(
        ended(&env, p).await,
        returned_once(p, &["queued", "sent", "paid", "returned"])
    );
    let reason = env
        .scalar_text(&format!("SELECT reason FROM settlement.payouts WHERE id = {}", p.id))
        .await;
    assert_eq!(reason, "returned: account_closed (event ev-returned)");
    verify_payouts(&env);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_return_heard_before_its_paid_returns_the_payout_once_and_the_late_paid_changes_nothing() {
    let (env, server, sim) = setup(&["--settle-delay-ms", "86400000"]).await;
    let payouts = make_payouts(&env, &server, 1).await;
    let p = &payouts[0];
    let payment = &sent(&env, &sim, &payouts).await[0];
    expect_outcome(
        &server,
        &event("ev-returned", "payment.returned", p, payment),
        "applied",
    )
    .await;
    assert_eq!(ended(&env, p).await, returned_once(p, &["queued", "sent", "returned"]));
    // The paid the provider sent first arrives now: old news.
    expect_outcome(&server, &event("ev-paid", "payment.paid", p, payment), "already").await;
    assert_eq!(ended(&env, p).await, returned_once(p, &["queued", "sent", "returned"]));
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_conflicts").await,
        0,
        "a paid before its return is no contradiction"
    );
    verify_payouts(&env);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_return_told_twice_under_one_event_id_and_again_under_another_is_credited_once() {
    let (env, server, sim) = setup(&["--settle-delay-ms", "86400000"]).await;
    let payouts = make_payouts(&env, &server, 1).await;
    let p = &payouts[0];
    let payment = &sent(&env, &sim, &payouts).await[0];
    expect_outcome(&server, &event("ev-paid", "payment.paid", p, payment), "applied").await;
    let returned = event("ev-returned", "payment.returned", p, payment);
    expect_outcome(&server, &returned, "applied").await;
    expect_outcome(&server, &returned, "duplicate").await;
    expect_outcome(
        &server,
        &event("ev-returned-2", "payment.returned", p, payment),
        "already",
    )
    .await;
    // A provider that says `failed` of the same return, later.
    expect_outcome(&server, &event("ev-failed", "payment.failed", p, payment), "already").await;
    assert_eq!(
        ended(&env, p).await,
        returned_once(p, &["queued", "sent", "paid", "returned"])
    );
    verify_payouts(&env);
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_after_paid_from_a_provider_without_a_returned_status_is_a_return_credited_once() {
    let (env, server, sim) = setup(&["--settle-delay-ms", "86400000"]).await;
    let payouts = make_payouts(&env, &server, 1).await;
    let p = &payouts[0];
    let payment = &sent(&env, &sim, &payouts).await[0];
    expect_outcome(&server, &event("ev-paid", "payment.paid", p, payment), "applied").await;
    expect_outcome(&server, &event("ev-failed", "payment.failed", p, payment), "applied").await;
    assert_eq!(
        ended(&env, p).await,
        returned_once(p, &["queued", "sent", "paid", "returned"])
    );
    assert_eq!(
        env.scalar_text(&format!("SELECT reason FROM settlement.payouts WHERE id = {}", p.id))
            .await,
        "failed: account_closed (event ev-failed)"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_conflicts").await,
        0
    );
    verify_payouts(&env);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_return_delivered_at_once_by_many_connections_to_two_servers_is_credited_once() {
    let (env, server, sim) = setup(&["--settle-delay-ms", "86400000"]).await;
    let second = env.serve_with(TOKEN, &["--provider-webhook-secret", SECRET]).await;
    let payouts = make_payouts(&env, &server, 1).await;
    let p = &payouts[0];
    let payment = &sent(&env, &sim, &payouts).await[0];
    expect_outcome(&server, &event("ev-paid", "payment.paid", p, payment), "applied").await;
    // Sixteen deliveries of the return at once: eight repeats of one event,
    // eight under ids of their own, half through each server.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let id = if i % 2 == 0 {
            "ev-returned".to_string()
        } else {
            format!("ev-returned-{i}")
        };
        let body = event(&id, "payment.returned", p, payment);
        let base = if i < 8 {
            server.base.clone()
        } else {
            second.base.clone()
        };
        tasks.push(tokio::spawn(async move { post_event(&base, &body).await }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        outcomes.push(body["outcome"].as_str().unwrap().to_string());
    }
    outcomes.sort();
    assert_eq!(
        outcomes.iter().filter(|o| *o == "applied").count(),
        1,
        "one delivery returned it: {outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .all(|o| ["applied", "already", "duplicate"].contains(&o.as_str())),
        "{outcomes:?}"
    );
    assert_eq!(
        ended(&env, p).await,
        returned_once(p, &["queued", "sent", "paid", "returned"])
    );
    verify_payouts(&env);
}

/// Returns paid payment `payment` at the simulator now (its bank sends it back).
async fn bank_returns(sim: &ProviderSim, payment: &str) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payments/{payment}/return", sim.url))
        .json(&json!({ "reason": "account_closed" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn state(env: &Env, id: i64) -> String {
    env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_return_whose_webhook_was_lost_is_found_by_the_look_up_of_paid_payouts_and_credited_once() {
    let (env, server, sim) = setup(&["--settle-delay-ms", "200", "--webhook-loss-rate", "1"]).await;
    let payouts = make_payouts(&env, &server, 2).await;
    let deliverer = deliver(&env, &sim, &["--returns-poll-every", "1s", "--returns-watch", "1h"]);
    wait_until(60, "both payouts paid, by look-ups", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE status = 'paid'")
            .await
            == 2
    })
    .await;
    let (returned, kept) = (&payouts[0], &payouts[1]);
    let payment = env
        .scalar_text(&format!(
            "SELECT provider_id FROM settlement.payouts WHERE id = {}",
            returned.id
        ))
        .await;
    assert_eq!(bank_returns(&sim, &payment).await["status"], "returned");
    wait_until(60, "the return found by a look-up", || async {
        state(&env, returned.id).await == "returned"
    })
    .await;
    // Looked up again and again: nothing more comes back.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    deliverer.stop();
    assert_eq!(
        ended(&env, returned).await,
        returned_once(returned, &["queued", "sent", "paid", "returned"])
    );
    assert_eq!(state(&env, kept.id).await, "paid");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.provider_events").await,
        0,
        "no webhook came: the look-ups found it all"
    );
    verify_payouts(&env);
    env.run_ok(&["reconcile", "--provider-url", &sim.url]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payout_a_look_up_finds_returned_before_its_paid_was_heard_goes_from_sent_to_returned_once() {
    let (env, server, sim) = setup(&["--settle-delay-ms", "300", "--webhook-loss-rate", "1"]).await;
    let payouts = make_payouts(&env, &server, 1).await;
    let p = &payouts[0];
    // Sent, and not looked up for an hour.
    let first = Deliverer(env.deliver(&sim.url, &["--poll-after-secs", "3600"]));
    wait_until(30, "the payout sent", || async { state(&env, p.id).await == "sent" }).await;
    first.stop();
    let payment = env
        .scalar_text(&format!(
            "SELECT provider_id FROM settlement.payouts WHERE id = {}",
            p.id
        ))
        .await;
    // The provider pays it (its webhook lost), then its bank returns it.
    let provider = settled::provider::HttpProvider::new(&sim.url, std::time::Duration::from_secs(5)).unwrap();
    wait_until(30, "the provider paid it", || async {
        settled::provider::PayoutProvider::lookup(&provider, &p.key)
            .await
            .unwrap()
            .is_some_and(|found| found.status == settled::provider::PaymentStatus::Paid)
    })
    .await;
    bank_returns(&sim, &payment).await;
    let second = deliver(&env, &sim, &[]);
    wait_until(30, "the look-up finds it returned", || async {
        state(&env, p.id).await == "returned"
    })
    .await;
    second.stop();
    assert_eq!(ended(&env, p).await, returned_once(p, &["queued", "sent", "returned"]));
    verify_payouts(&env);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_without_a_returned_status_says_failed_after_paid_and_each_such_payout_is_returned_once() {
    let (env, server, sim) = setup(&[
        "--settle-delay-ms",
        "100",
        "--return-rate",
        "1",
        "--return-delay-ms",
        "300",
        "--returns-as-failed",
        "--webhook-duplicate-rate",
        "0.5",
    ])
    .await;
    let payouts = make_payouts(&env, &server, 4).await;
    let deliverer = deliver(&env, &sim, &[]);
    wait_until(60, "every payout returned", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE status = 'returned'")
            .await
            == 4
    })
    .await;
    deliverer.stop();
    for p in &payouts {
        assert_eq!(
            ended(&env, p).await,
            returned_once(p, &["queued", "sent", "paid", "returned"])
        );
    }
    let counters = sim.counters().await;
    assert_eq!(counters["returned"], 4, "{counters}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_conflicts").await,
        0
    );
    verify_payouts(&env);
    env.run_ok(&["reconcile", "--provider-url", &sim.url]);
}
