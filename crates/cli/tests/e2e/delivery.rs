//! Payouts leave the database exactly once, with real processes: `settled
//! deliver` against the provider simulator (asynchronous payments, signed
//! webhooks duplicated, held back and lost, 429s, refusals, an outage),
//! webhooks into `settled serve`, lookups of payouts whose webhook never
//! came, and leased settlement paying through the same provider.

use crate::common;

use std::process::Child;
use std::time::Duration;

use common::{wait_until, Env, ProviderSim, Server, PERIOD};
use serde_json::{json, Value};

const TOKEN: &str = "test-token";
const SECRET: &str = "whsec-test";

/// A settled period, a server that takes webhooks, a simulator posting them.
async fn setup(creators: &str, sim_flags: &[&str]) -> (Env, Server, ProviderSim) {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", creators]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve_with(TOKEN, &["--provider-webhook-secret", SECRET]).await;
    let sim = ProviderSim::start(sim_flags);
    sim.post_webhooks_to(&server, SECRET).await;
    (env, server, sim)
}

/// `n` payouts of `amount`, one per creator with enough balance.
async fn make_payouts(env: &Env, server: &Server, n: i64, amount: &str) -> Vec<i64> {
    let creators = common::creators_with_balance(env, n, amount).await;
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for (i, creator) in creators.iter().enumerate() {
        let r = client
            .post(format!("{}/v1/payouts", server.base))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", format!("p-{i}"))
            .json(&json!({ "creator": creator, "amount": amount }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_i64().unwrap());
    }
    ids
}

/// `settled deliver`, looking up payouts sent `poll_after` seconds ago.
fn deliver(env: &Env, sim: &ProviderSim, poll_after: &str) -> Child {
    env.deliver(
        &sim.url,
        &[
            "--provider-timeout-ms",
            "500",
            "--poll-after-secs",
            poll_after,
            "--batch",
            "10",
        ],
    )
}

fn stop(mut child: Child) {
    common::stop(&mut child);
}

async fn count(env: &Env, sql: &str) -> i64 {
    env.scalar_i64(sql).await
}

/// Every payout final: paid once at the provider, or failed and returned once.
async fn check_final(env: &Env, sim: &ProviderSim) {
    assert_eq!(
        count(
            env,
            "SELECT count(*) FROM settlement.payouts WHERE status NOT IN ('paid', 'failed')"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            env,
            "SELECT count(*) FROM settlement.payouts p
             WHERE (p.status = 'failed') <> EXISTS (SELECT 1 FROM settlement.payout_returns r WHERE r.payout_id = p.id)"
        )
        .await,
        0,
        "exactly the failed payouts were returned"
    );
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let payments = provider.list_all().await.unwrap();
    let mut keys: Vec<&str> = payments.iter().map(|p| p.idempotency_key.as_str()).collect();
    keys.sort_unstable();
    let before = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), before, "one payment per key at the provider");
    for p in &payments {
        let (status, amount): (String, String) =
            sqlx::query_as("SELECT status, amount::text FROM settlement.payouts WHERE provider_key = $1")
                .bind(&p.idempotency_key)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        assert_eq!(amount, p.amount, "the provider paid the payout's amount");
        assert_eq!(
            status,
            p.status.as_str(),
            "{}: settled and the provider agree",
            p.idempotency_key
        );
    }
    env.run_ok(&["verify", "--period", PERIOD]);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_deliverers_pay_each_payout_once_and_webhooks_finish_them_through_every_fault() {
    let (env, server, sim) = setup(
        "300",
        &[
            "--settle-delay-ms",
            "200",
            "--failure-rate",
            "0.2",
            "--error-rate",
            "0.1",
            "--applied-timeout-rate",
            "0.1",
            "--applied-timeout-ms",
            "800",
            "--rate-limit-rate",
            "0.05",
            "--webhook-duplicate-rate",
            "0.3",
            "--webhook-reorder-rate",
            "0.3",
            "--webhook-reorder-max-ms",
            "500",
            "--webhook-loss-rate",
            "0.2",
        ],
    )
    .await;
    let ids = make_payouts(&env, &server, 150, "1000").await;
    let (a, b) = (deliver(&env, &sim, "1"), deliver(&env, &sim, "1"));
    wait_until(120, "every payout paid or failed", || async {
        count(
            &env,
            "SELECT count(*) FROM settlement.payouts WHERE status IN ('paid', 'failed')",
        )
        .await
            == ids.len() as i64
    })
    .await;
    stop(a);
    stop(b);
    check_final(&env, &sim).await;
    let counters = sim.counters().await;
    println!("simulator: {counters}");
    assert!(count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'failed'").await > 0);
    assert!(
        count(
            &env,
            "SELECT count(*) FROM settlement.provider_events WHERE outcome = 'applied'"
        )
        .await
            > 0,
        "webhooks moved payouts"
    );
    assert_eq!(count(&env, "SELECT count(*) FROM settlement.payout_conflicts").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_fails_the_payout_and_returns_its_funds_and_an_outage_spends_no_attempt() {
    let (env, server, sim) = setup("40", &["--refusal-rate", "0.3", "--error-rate", "1"]).await;
    let ids = make_payouts(&env, &server, 20, "500").await;
    let a = deliver(&env, &sim, "1");
    // The provider is down: jobs wait, snoozed; no attempt is spent.
    wait_until(30, "the fleet to see the provider down", || async {
        count(
            &env,
            "SELECT count(*) FROM settlement.provider_limits WHERE down_streak > 0",
        )
        .await
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM settlement.payout_jobs WHERE attempt - attempt_base > 1"
        )
        .await,
        0,
        "an outage spends no attempt"
    );
    assert_eq!(
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status <> 'queued'").await,
        0
    );
    // Back up: everything is delivered; refusals fail and return.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/faults", sim.url))
        .json(&json!({ "refusal_rate": 0.3 }))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    wait_until(90, "every payout paid or failed", || async {
        count(
            &env,
            "SELECT count(*) FROM settlement.payouts WHERE status IN ('paid', 'failed')",
        )
        .await
            == ids.len() as i64
    })
    .await;
    stop(a);
    check_final(&env, &sim).await;
    let refused = count(
        &env,
        "SELECT count(*) FROM settlement.payouts WHERE status = 'failed' AND reason LIKE 'refused by the provider%'",
    )
    .await;
    assert!(refused > 0, "some payouts were refused");
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_are_checked_applied_once_and_a_contradiction_or_a_payment_of_another_amount_or_creator_is_recorded_never_applied(
) {
    let (env, server, sim) = setup("20", &["--settle-delay-ms", "100000"]).await;
    let ids = make_payouts(&env, &server, 2, "100").await;
    let a = deliver(&env, &sim, "3600");
    wait_until(30, "both payouts sent", || async {
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'sent'").await == 2
    })
    .await;
    stop(a);
    let key: String = env
        .scalar_text(&format!(
            "SELECT provider_key FROM settlement.payouts WHERE id = {}",
            ids[0]
        ))
        .await;
    let provider_id: String = env
        .scalar_text(&format!(
            "SELECT provider_id FROM settlement.payouts WHERE id = {}",
            ids[0]
        ))
        .await;
    let creator: String = env
        .scalar_text(&format!("SELECT creator FROM settlement.payouts WHERE id = {}", ids[0]))
        .await;
    let event = |id: &str, kind: &str| {
        json!({ "id": id, "type": kind, "created": 1, "data": {
            "id": provider_id, "idempotency_key": key, "creator": creator, "amount": "100",
            "status": if kind == "payment.paid" { "paid" } else { "failed" },
            "failure_reason": if kind == "payment.paid" { Value::Null } else { json!("account closed") } } })
    };
    let post = |body: Value, secret: &'static str| {
        let url = format!("{}/v1/provider-events", server.base);
        async move {
            let raw = serde_json::to_vec(&body).unwrap();
            let now = chrono::Utc::now().timestamp();
            let header = settled::provider::signature::sign(secret.as_bytes(), now, &raw);
            let r = reqwest::Client::new()
                .post(url)
                .header("Provider-Signature", header)
                .header("Content-Type", "application/json")
                .body(raw)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    // A wrong secret: refused, nothing applied, counted.
    let (status, body) = post(event("ev-1", "payment.paid"), "not-the-secret").await;
    assert_eq!(
        (status, body["type"].as_str()),
        (400, Some("/problems/bad-signature")),
        "{body}"
    );
    assert_eq!(
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'paid'").await,
        0
    );
    // A payment under the payout's key that pays another amount, or
    // someone else: a conflict, recorded, never applied.
    let mut short = event("ev-0", "payment.paid");
    short["data"]["amount"] = json!("99");
    let mut elsewhere = event("ev-00", "payment.paid");
    elsewhere["data"]["creator"] = json!("0x00000000000000000000000000000000000000ee");
    for wrong in [short, elsewhere] {
        let (status, body) = post(wrong, SECRET).await;
        assert_eq!((status, body["outcome"].as_str()), (200, Some("conflict")), "{body}");
    }
    assert_eq!(
        env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {}", ids[0]))
            .await,
        "sent"
    );
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM settlement.payout_conflicts WHERE source = 'webhook' AND detail LIKE '%not applied'"
        )
        .await,
        2
    );
    // Applied once; its repeat changes nothing.
    let (status, body) = post(event("ev-1", "payment.paid"), SECRET).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("applied")), "{body}");
    let (status, body) = post(event("ev-1", "payment.paid"), SECRET).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    // Failed after paid (a provider without a returned status): a return,
    // its funds back once (tests/e2e/returns.rs has every order of it).
    let (status, body) = post(event("ev-2", "payment.failed"), SECRET).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("applied")), "{body}");
    assert_eq!(
        env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {}", ids[0]))
            .await,
        "returned"
    );
    assert_eq!(count(&env, "SELECT count(*) FROM settlement.payout_returns").await, 1);
    // Paid after that: old news, not a flip back.
    let (status, body) = post(event("ev-2b", "payment.paid"), SECRET).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("already")), "{body}");
    assert_eq!(count(&env, "SELECT count(*) FROM settlement.payout_returns").await, 1);
    assert_eq!(count(&env, "SELECT count(*) FROM settlement.payout_conflicts").await, 2);
    // An event for a payout settled never made is kept for review.
    let mut unknown = event("ev-3", "payment.paid");
    unknown["data"]["idempotency_key"] = json!("payout-999999");
    let (status, body) = post(unknown, SECRET).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("unknown_payout")),
        "{body}"
    );
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("settled_webhook_signature_failures_total{reason=\"no_match\"} 1"),
        "{metrics}"
    );
    drop(sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_webhook_is_made_good_by_a_lookup() {
    let (env, server, sim) = setup("20", &["--settle-delay-ms", "300", "--webhook-loss-rate", "1"]).await;
    let ids = make_payouts(&env, &server, 5, "100").await;
    let a = deliver(&env, &sim, "1");
    wait_until(60, "every payout paid, by lookups", || async {
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'paid'").await == ids.len() as i64
    })
    .await;
    stop(a);
    assert_eq!(count(&env, "SELECT count(*) FROM settlement.provider_events").await, 0);
    check_final(&env, &sim).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leased_settlement_pays_through_the_provider_and_a_failed_payment_returns_the_reward() {
    let env = Env::new().await;
    env.seed(60);
    let sim = ProviderSim::start(&["--failure-rate", "0.3"]);
    env.run_ok(&[
        "worker",
        "--period",
        PERIOD,
        "--mode",
        "leased",
        "--provider-url",
        &sim.url,
    ]);
    // The payments were accepted pending: the delivery's lookups finish them.
    let a = deliver(&env, &sim, "1");
    wait_until(60, "every settlement payment paid or failed", || async {
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'sent'").await == 0
    })
    .await;
    stop(a);
    // Each paid creator's reward left as a settlement payout; the failed
    // ones are back on the balance.
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM settlement.reward_ledger l
             WHERE l.amount > 0 AND NOT EXISTS (SELECT 1 FROM settlement.payouts p
                                                WHERE p.kind = 'settlement' AND p.creator = l.creator)"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM settlement.creator_balance b
             WHERE b.balance <> coalesce((SELECT sum(r.amount) FROM settlement.payout_returns r
                                          WHERE r.creator = b.creator), 0)"
        )
        .await,
        0,
        "a balance holds exactly the rewards whose payment failed"
    );
    assert!(count(&env, "SELECT count(*) FROM settlement.payout_returns").await > 0);
    env.run_ok(&["verify", "--period", PERIOD, "--provider-url", &sim.url]);
    env.run_ok(&["verify", "--payouts", "--provider-url", &sim.url]);
    env.run_ok(&["reconcile", "--provider-url", &sim.url]);
    // The provider now says a paid settlement payment is pending: the
    // period's reconciliation reads statuses, not only keys and amounts.
    let (id, key): (i64, String) = sqlx::query_as(
        "SELECT id, provider_key FROM settlement.payouts WHERE kind = 'settlement' AND status = 'paid' ORDER BY id LIMIT 1",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let payment = settled::provider::PayoutProvider::lookup(&provider, &key)
        .await
        .unwrap()
        .expect("the payment");
    let r = reqwest::Client::new()
        .patch(format!("{}/v1/payments/{}", sim.url, payment.id))
        .json(&json!({ "status": "pending" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let out = env.run(&["verify", "--period", PERIOD, "--provider-url", &sim.url]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("[FAIL] provider_states_agree")
            && report.contains(&format!(
                "- payout {id} ({key}): settled says paid, the provider's payment"
            )),
        "{report}"
    );
}

/// `event` signed with the test secret and posted to `server`: its status and answer.
async fn post_event(server: &Server, event: &Value) -> (u16, Value) {
    let raw = serde_json::to_vec(event).unwrap();
    let header = settled::provider::signature::sign(SECRET.as_bytes(), chrono::Utc::now().timestamp(), &raw);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/provider-events", server.base))
        .header("Provider-Signature", header)
        .header("Content-Type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// A signed `payment.paid` event for payout `id`'s key, naming payment `payment`.
async fn paid_event(env: &Env, event_id: &str, id: i64, payment: &str) -> Value {
    let (key, creator, amount): (String, String, String) =
        sqlx::query_as("SELECT provider_key, creator, amount::text FROM settlement.payouts WHERE id = $1")
            .bind(id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    json!({ "id": event_id, "type": "payment.paid", "created": 1, "data": {
        "id": payment, "idempotency_key": key, "creator": creator, "amount": amount,
        "status": "paid", "failure_reason": null } })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payment_id_another_payout_holds_is_a_conflict_that_wedges_nothing_and_a_recorded_id_is_never_overwritten() {
    let (env, server, first) = setup("20", &["--settle-delay-ms", "100000"]).await;
    let ids = make_payouts(&env, &server, 3, "100").await;
    let (early, clashing, other) = (ids[0], ids[1], ids[2]);
    // The first payout is delivered before the others exist at the provider:
    // the other two wait, queued, while their jobs are parked.
    sqlx::query("UPDATE settlement.payout_jobs SET not_before = now() + interval '1 hour' WHERE payout_id <> $1")
        .bind(early)
        .execute(&env.pool)
        .await
        .unwrap();
    let a = deliver(&env, &first, "3600");
    let state =
        |id: i64| format!("SELECT status || ':' || coalesce(provider_id, '') FROM settlement.payouts WHERE id = {id}");
    wait_until(30, "the first payout sent", || async {
        env.scalar_text(&state(early)).await == "sent:pay_000000000001"
    })
    .await;
    stop(a);
    // A fresh provider (a restarted simulator, a bridge moved to another
    // provider): its payment ids start again at pay_000000000001.
    drop(first);
    let fresh = ProviderSim::start(&["--settle-delay-ms", "100000"]);
    sqlx::query("UPDATE settlement.payout_jobs SET not_before = now() WHERE payout_id = $1")
        .bind(clashing)
        .execute(&env.pool)
        .await
        .unwrap();
    let b = deliver(&env, &fresh, "3600");
    let job = |id: i64| {
        format!("SELECT status || ' ' || coalesce(last_error, '') FROM settlement.payout_jobs WHERE payout_id = {id}")
    };
    wait_until(60, "the clashing payout's job a dead letter", || async {
        env.scalar_text(&job(clashing)).await.starts_with("failed ")
    })
    .await;
    // The others are not held up by it.
    sqlx::query("UPDATE settlement.payout_jobs SET not_before = now() WHERE payout_id = $1")
        .bind(other)
        .execute(&env.pool)
        .await
        .unwrap();
    wait_until(60, "the other payout sent", || async {
        env.scalar_text(&state(other)).await == "sent:pay_000000000002"
    })
    .await;
    stop(b);
    let error = env.scalar_text(&job(clashing)).await;
    assert!(
        error.contains(&format!("the provider's payment pay_000000000001 is payout {early}'s")),
        "the job names the real cause: {error}"
    );
    assert_eq!(
        env.scalar_text(&state(clashing)).await,
        "queued:",
        "funds held, nothing recorded"
    );
    assert_eq!(
        count(
            &env,
            &format!(
                "SELECT count(*) FROM settlement.payout_conflicts
                 WHERE payout_id = {clashing} AND source = 'delivery' AND detail LIKE '%is payout {early}''s%'"
            )
        )
        .await,
        1
    );
    // The fresh provider's webhook for that payment: a conflict, answered
    // 200 (not an error the provider retries for ever).
    let (status, body) = post_event(
        &server,
        &paid_event(&env, "ev-clash", clashing, "pay_000000000001").await,
    )
    .await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("conflict")), "{body}");
    // A later event naming another payment never overwrites the recorded id.
    let (status, body) = post_event(
        &server,
        &paid_event(&env, "ev-other-id", early, "pay_000000000777").await,
    )
    .await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("conflict")), "{body}");
    assert_eq!(env.scalar_text(&state(early)).await, "sent:pay_000000000001");
    assert_eq!(env.scalar_text(&state(clashing)).await, "queued:");
    env.run_ok(&["verify", "--payouts"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paid_webhook_for_a_payout_awaiting_its_confirmation_is_a_conflict_for_review() {
    let (env, server, _sim) = setup("20", &[]).await;
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
        .await;
    let made: Value = reqwest::Client::new()
        .post(format!("{}/v1/payouts", server.base))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "awaiting-1")
        .json(&json!({ "creator": creator, "amount": "100", "confirm": true }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = made["id"].as_i64().unwrap();
    let (status, body) = post_event(&server, &paid_event(&env, "ev-early", id, "pay_000000000042").await).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("conflict")), "{body}");
    assert_eq!(
        env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
            .await,
        "created"
    );
    assert_eq!(
        count(
            &env,
            &format!(
                "SELECT count(*) FROM settlement.payout_conflicts
                 WHERE payout_id = {id} AND state = 'created' AND provider_status = 'paid' AND event_id = 'ev-early'"
            )
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM settlement.provider_events WHERE id = 'ev-early' AND outcome = 'conflict'"
        )
        .await,
        1,
        "in the review list"
    );
}
