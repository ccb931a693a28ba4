//! Reconciliation and `verify --payouts`, with real processes: payouts
//! delivered through the provider simulator by `settled deliver`, webhooks
//! into `settled serve`, then `settled reconcile` and `settled verify
//! --payouts` run as a user runs them; the simulator's records made wrong
//! on purpose (`DELETE`/`PATCH /v1/payments/{id}`, a payment made behind
//! settled's back), and a balance and a history changed in SQL.

use crate::common;

use std::collections::HashSet;
use std::process::{Child, Output};

use common::{free_port, wait_until, Env, ProviderSim, Server, PERIOD};
use serde_json::{json, Value};

mod mismatches;
mod queue;
mod verify;

const TOKEN: &str = "test-token";
const SECRET: &str = "whsec-test";

/// A settled period for `creators`, a server taking webhooks (with `serve`
/// flags), and a simulator posting them to it.
async fn setup(creators: &str, sim_flags: &[&str], serve: &[&str]) -> (Env, Server, ProviderSim) {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", creators]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let mut flags = vec!["--provider-webhook-secret", SECRET];
    flags.extend_from_slice(serve);
    let server = env.serve_with(TOKEN, &flags).await;
    let sim = ProviderSim::start(sim_flags);
    point_webhooks(&sim, &server).await;
    (env, server, sim)
}

async fn point_webhooks(sim: &ProviderSim, server: &Server) {
    sim.post_webhooks_to(server, SECRET).await;
}

/// `settled deliver`, looking up payouts sent a second ago.
fn deliver(env: &Env, sim: &ProviderSim) -> Child {
    env.deliver(&sim.url, common::QUICK_LOOKUPS)
}

fn stop(mut child: Child) {
    common::stop(&mut child);
}

async fn post(url: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
    let response = common::post_json(&reqwest::Client::new(), url, TOKEN, key, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// One payout of `amount` for each of `n` creators, keys `{prefix}-{i}`.
async fn make_payouts(env: &Env, server: &Server, prefix: &str, n: i64, amount: &str) -> Vec<i64> {
    let creators = common::creators_with_balance(env, n, amount).await;
    let mut ids = Vec::new();
    for (i, creator) in creators.iter().enumerate() {
        let (status, body) = post(
            &format!("{}/v1/payouts", server.base),
            Some(&format!("{prefix}-{i}")),
            &json!({ "creator": creator, "amount": amount }),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["id"].as_i64().unwrap());
    }
    ids
}

async fn count(env: &Env, sql: &str) -> i64 {
    env.scalar_i64(sql).await
}

async fn wait_final(env: &Env, what: &str) {
    wait_until(90, what, || async {
        count(
            env,
            "SELECT count(*) FROM settlement.payouts WHERE status IN ('created', 'queued', 'sent')",
        )
        .await
            == 0
    })
    .await;
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn reconcile_json(env: &Env, sim: &ProviderSim) -> (i32, Value) {
    let out = env.run(&["reconcile", "--provider-url", &sim.url, "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    (out.status.code().unwrap(), report)
}

/// The provider's payment under `key`.
async fn payment(sim: &ProviderSim, key: &str) -> Value {
    let r = reqwest::get(format!("{}/v1/payments?idempotency_key={key}", sim.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a payment under {key}");
    r.json().await.unwrap()
}

async fn tamper(sim: &ProviderSim, method: reqwest::Method, id: &str, body: Option<Value>) {
    let mut request = reqwest::Client::new().request(method, format!("{}/v1/payments/{id}", sim.url));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// A payment made straight at the provider, behind settled's back.
async fn pay_directly(sim: &ProviderSim, key: &str, creator: &str, amount: &str, reference: Option<&str>) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payments", sim.url))
        .header("Idempotency-Key", key)
        .json(&json!({ "creator": creator, "amount": amount, "reference": reference }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

/// The provider key settled sends for payout `id`.
async fn key_of(env: &Env, id: i64) -> String {
    sqlx::query_scalar("SELECT provider_key FROM settlement.payouts WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}
