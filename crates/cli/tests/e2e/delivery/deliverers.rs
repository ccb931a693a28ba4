//! `settled deliver` through faults, refusals, outages, lost webhooks and leased settlement.

use super::*;

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
    all_final(&env, 120, ids.len()).await;
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
    all_final(&env, 90, ids.len()).await;
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
    env.run_leased_worker(&sim.url, &[]);
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

/// Waits up to `secs` until all `n` payouts are paid or failed.
async fn all_final(env: &Env, secs: u64, n: usize) {
    wait_until(secs, "every payout paid or failed", || async {
        count(
            env,
            "SELECT count(*) FROM settlement.payouts WHERE status IN ('paid', 'failed')",
        )
        .await
            == n as i64
    })
    .await;
}
