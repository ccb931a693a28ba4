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

mod deliverers;
mod webhooks;

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
