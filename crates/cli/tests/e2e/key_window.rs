//! The provider's key window, with real processes: the provider simulator
//! forgets idempotency keys a second after their first use (as Stripe may
//! prune a key after a day), and a payout whose answer was lost is sent
//! again later than that: retried, a dead letter replayed, or a leased
//! settlement item retried. `--provider-key-window 1s` makes settled find
//! the payment by its reference first: paid once, never twice. When the
//! provider cannot say, nothing is sent and the payout waits for an
//! operator, whom `settled reconcile` and the dashboard name.

use crate::common;

use std::time::Duration;

use common::{wait_until, Deliverer, Env, ProviderSim, Server, PERIOD};
use serde_json::{json, Value};

const TOKEN: &str = "test-token";
const AMOUNT: &str = "1000";
/// The simulator forgets a key this long after its first use.
const FORGET_MS: &str = "1000";
/// What settled is told the provider keeps keys for: no longer than it does.
const WINDOW: &str = "1s";

async fn settled_env() -> (Env, Server) {
    let env = Env::new().await;
    env.seed(20);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve(TOKEN).await;
    (env, server)
}

/// A payout of [`AMOUNT`] to the richest creator: its id and provider key.
async fn make_payout(env: &Env, server: &Server, request_key: &str) -> (i64, String) {
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC, creator LIMIT 1")
        .await;
    let id = common::create_payout(server, TOKEN, request_key, &creator, AMOUNT).await;
    (id, common::provider_key_of(env, id).await)
}

async fn set_faults(sim: &ProviderSim, faults: Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/faults", sim.url))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// `settled deliver` with a provider key window of `window`.
fn deliver(env: &Env, sim: &ProviderSim, window: &str) -> Deliverer {
    Deliverer(env.deliver(
        &sim.url,
        &[
            "--provider-timeout-ms",
            "500",
            "--poll-after-secs",
            "1",
            "--provider-key-window",
            window,
        ],
    ))
}

/// The simulator's faults of these tests: keys forgotten after
/// [`FORGET_MS`], payments paid 4 s after they are made, webhooks lost
/// (look-ups finish the payouts), and `more`.
fn faults(more: Value) -> Value {
    let mut faults = json!({
        "forget_keys_after_ms": FORGET_MS.parse::<u64>().unwrap(),
        "settle_delay_ms": 4000,
        "webhook_loss_rate": 1.0,
    });
    faults
        .as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    faults
}

/// Payout `id`'s first call: the provider applies it, and its answer is
/// lost (after the caller's timeout); then every call is rate limited, so
/// nothing more is sent until the deliverer is stopped. Returns when the
/// deliverer is stopped, the payout still queued.
async fn first_answer_lost(env: &Env, sim: &ProviderSim, id: i64) {
    set_faults(
        sim,
        faults(json!({ "applied_timeout_rate": 1.0, "applied_timeout_ms": 3000 })),
    )
    .await;
    let first = deliver(env, sim, WINDOW);
    wait_until(30, "the first call applied, its answer lost", || async {
        sim.counters().await["applied_then_timed_out"] == 1
    })
    .await;
    set_faults(sim, faults(json!({ "rate_limit_rate": 1.0, "retry_after_secs": 30 }))).await;
    first.stop();
    assert_eq!(status(env, id).await, "queued", "its answer never reached settled");
}

async fn status(env: &Env, id: i64) -> String {
    env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
        .await
}

/// Every payment the simulator made, under `key`.
async fn payments_under(sim: &ProviderSim, key: &str) -> Vec<settled::provider::Payment> {
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let all = provider.list_all().await.unwrap();
    all.into_iter().filter(|p| p.idempotency_key == key).collect()
}

/// The payout's job made a dead letter, as after its attempts ran out (the
/// engine's own verb for it is the retry policy, 25 attempts).
async fn dead_letter(env: &Env, id: i64) {
    sqlx::query(
        "UPDATE settlement.payout_jobs SET status = 'failed', last_error = 'attempts spent', lease_owner = NULL,
                lease_until = NULL
         WHERE payout_id = $1",
    )
    .bind(id)
    .execute(&env.pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payout_retried_after_the_providers_key_window_is_found_by_its_reference_and_paid_once() {
    let (env, server) = settled_env().await;
    let sim = ProviderSim::start(&[]);
    let (id, key) = make_payout(&env, &server, "late-retry").await;
    first_answer_lost(&env, &sim, id).await;
    // Past the window at both ends, the provider takes calls again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_faults(&sim, faults(json!({}))).await;
    let late = deliver(&env, &sim, WINDOW);
    wait_until(60, "the payout paid", || async { status(&env, id).await == "paid" }).await;
    late.stop();
    let payments = payments_under(&sim, &key).await;
    assert_eq!(payments.len(), 1, "paid once: {payments:?}");
    let counters = sim.counters().await;
    assert_eq!(counters["applied"], 1, "{counters}");
    assert!(counters["reference_lookups"].as_u64().unwrap() >= 1, "{counters}");
    env.run_ok(&["reconcile", "--provider-url", &sim.url]);
    env.run_ok(&["verify", "--payouts", "--provider-url", &sim.url]);
}

/// What the window guards against, shown: told the provider keeps keys for
/// ever, settled sends the late retry under the forgotten key, and the
/// provider pays it again. Reconcile then names the payout paid twice.
#[tokio::test(flavor = "multi_thread")]
async fn told_a_window_longer_than_the_provider_keeps_keys_a_late_retry_is_paid_twice_and_reconcile_says_so() {
    let (env, server) = settled_env().await;
    let sim = ProviderSim::start(&[]);
    let (id, key) = make_payout(&env, &server, "window-too-long").await;
    first_answer_lost(&env, &sim, id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_faults(&sim, faults(json!({}))).await;
    let late = deliver(&env, &sim, "3650d");
    wait_until(60, "a second payment under the key", || async {
        payments_under(&sim, &key).await.len() == 2
    })
    .await;
    late.stop();
    assert_eq!(sim.counters().await["applied"], 2, "paid twice");
    let out = env.run(&["reconcile", "--provider-url", &sim.url]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains(&format!("[paid_twice] payout {id}")), "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_replayed_after_the_providers_key_window_is_paid_once() {
    let (env, server) = settled_env().await;
    let sim = ProviderSim::start(&[]);
    let (id, key) = make_payout(&env, &server, "late-replay").await;
    first_answer_lost(&env, &sim, id).await;
    dead_letter(&env, id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_faults(&sim, faults(json!({}))).await;
    let deliverer = deliver(&env, &sim, WINDOW);
    env.run_ok(&["queues", "replay", "payout_delivery", "--key", &id.to_string()]);
    wait_until(60, "the payout paid", || async { status(&env, id).await == "paid" }).await;
    deliverer.stop();
    assert_eq!(payments_under(&sim, &key).await.len(), 1, "paid once");
    assert_eq!(sim.counters().await["applied"], 1);
    env.run_ok(&["verify", "--payouts", "--provider-url", &sim.url]);
}

/// The payout's key waits for an operator: nothing more was sent, its job
/// is a dead letter, reconcile names it (exit 1), the dashboard lists it.
async fn assert_waits_for_an_operator(env: &Env, server: &Server, sim: &ProviderSim, id: i64, key: &str) {
    wait_until(30, "the key waiting for an operator", || async {
        env.scalar_i64(&format!(
            "SELECT count(*) FROM settlement.provider_keys WHERE key = '{key}' AND awaiting_operator_since IS NOT NULL"
        ))
        .await
            == 1
    })
    .await;
    wait_until(30, "its delivery a dead letter", || async {
        env.scalar_text(&format!(
            "SELECT status FROM settlement.payout_jobs WHERE payout_id = {id}"
        ))
        .await
            == "failed"
    })
    .await;
    assert_eq!(status(env, id).await, "queued", "its funds held, nothing sent");
    let out = env.run(&["reconcile", "--provider-url", &sim.url]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains(&format!("[awaiting_operator] payout {id} ({key})")),
        "{report}"
    );
    let page = common::get_text(&common::client_with(TOKEN), &format!("{}/payouts", server.base)).await;
    assert!(
        page.contains("keys waiting for an operator (1)") && page.contains(&format!("data-key=\"{key}\"")),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_key_window_a_provider_that_cannot_say_leaves_the_payout_waiting_for_an_operator_and_nothing_is_sent()
{
    let (env, server) = settled_env().await;
    let sim = ProviderSim::start(&[]);
    let (id, key) = make_payout(&env, &server, "cannot-say").await;
    first_answer_lost(&env, &sim, id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_faults(&sim, faults(json!({ "no_reference_lookup": true }))).await;
    let deliverer = deliver(&env, &sim, WINDOW);
    assert_waits_for_an_operator(&env, &server, &sim, id, &key).await;
    // A replay sends nothing either: the key still waits.
    env.run_ok(&["queues", "replay", "payout_delivery", "--key", &id.to_string()]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    deliverer.stop();
    assert_eq!(status(&env, id).await, "queued");
    assert_eq!(
        payments_under(&sim, &key).await.len(),
        1,
        "the first call's payment alone"
    );
    assert_eq!(sim.counters().await["applied"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_who_found_no_payment_renews_the_key_and_the_replayed_payout_is_paid_once() {
    let (env, server) = settled_env().await;
    let sim = ProviderSim::start(&[]);
    let (id, key) = make_payout(&env, &server, "renewed").await;
    // The first call never reaches the provider's books (503s), and the
    // provider cannot look payments up by reference.
    set_faults(&sim, faults(json!({ "error_rate": 1.0, "no_reference_lookup": true }))).await;
    let first = deliver(&env, &sim, WINDOW);
    wait_until(30, "the first call refused with a 503", || async {
        sim.counters().await["injected_errors"].as_u64().unwrap() >= 1
    })
    .await;
    first.stop();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_faults(&sim, faults(json!({ "no_reference_lookup": true }))).await;
    let deliverer = deliver(&env, &sim, WINDOW);
    assert_waits_for_an_operator(&env, &server, &sim, id, &key).await;
    // The operator checks the provider's books: nothing under the key.
    assert!(payments_under(&sim, &key).await.is_empty());
    let renewed: bool = sqlx::query_scalar("SELECT settlement.renew_provider_key($1)")
        .bind(&key)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(renewed);
    // From now on the provider looks payments up by reference again (the
    // look-ups that finish the payout go by reference past the window).
    set_faults(&sim, faults(json!({}))).await;
    env.run_ok(&["queues", "replay", "payout_delivery", "--key", &id.to_string()]);
    wait_until(60, "the payout paid", || async { status(&env, id).await == "paid" }).await;
    deliverer.stop();
    assert_eq!(payments_under(&sim, &key).await.len(), 1, "paid once");
    env.run_ok(&["reconcile", "--provider-url", &sim.url]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leased_settlement_item_retried_after_the_providers_key_window_is_paid_once() {
    let env = Env::new().await;
    env.seed(5);
    // Every first payment is applied and answered too late; a retry comes
    // after the provider has forgotten the key.
    let sim = ProviderSim::start(&[
        "--applied-timeout-rate",
        "1",
        "--applied-timeout-ms",
        "1500",
        "--forget-keys-after-ms",
        FORGET_MS,
    ]);
    let flags = [
        "--provider-key-window",
        WINDOW,
        "--provider-timeout-ms",
        "300",
        "--backoff-base-ms",
        "2500",
        "--backoff-cap-ms",
        "2500",
        "--max-attempts",
        "20",
    ];
    let out = env.run_leased_worker(&sim.url, &[&flags[..], common::SHORT_LEASES].concat());
    assert!(out.contains("finished"), "{out}");
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let payments = provider.list_all().await.unwrap();
    let mut keys: Vec<&str> = payments.iter().map(|p| p.idempotency_key.as_str()).collect();
    keys.sort_unstable();
    let made = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), made, "one payment per key: {payments:?}");
    let counters = sim.counters().await;
    assert!(
        counters["reference_lookups"].as_u64().unwrap() >= 1,
        "a retry past the window found its payment by reference: {counters}"
    );
    env.run_ok(&["verify", "--period", PERIOD, "--provider-url", &sim.url]);
}

#[test]
fn a_key_window_that_is_not_a_duration_is_refused_naming_the_flag() {
    for (args, env, says) in [
        (vec!["--provider-key-window", "24"], None, "has no unit"),
        (
            vec!["--provider-key-window", "1.5h"],
            None,
            "the units are s, m, h and d",
        ),
        (vec!["--provider-key-window", "0s"], None, "is not within 1s..=3650d"),
        (vec![], Some("forever"), "does not start with a whole number"),
    ] {
        for command in ["deliver", "worker"] {
            let mut cmd = std::process::Command::new(common::SETTLED);
            cmd.args([command, "--provider-url", "http://127.0.0.1:9"])
                .args(&args)
                .env_remove("DATABASE_URL")
                .stdin(std::process::Stdio::null());
            if let Some(value) = env {
                cmd.env("SETTLED_PROVIDER_KEY_WINDOW", value);
            }
            let out = cmd.output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} {args:?}: {stderr}");
            assert!(
                stderr.contains("--provider-key-window") && stderr.contains(says),
                "{command} {args:?} {env:?}: {stderr}"
            );
        }
    }
}
