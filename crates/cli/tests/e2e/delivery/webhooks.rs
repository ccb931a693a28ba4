//! Webhooks checked and applied once: contradictions, other amounts or creators, payment ids another payout holds, early paid webhooks.

use super::*;

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
        let base = server.base.clone();
        async move { common::post_signed_event(&base, secret, &body).await }
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
    let metrics = common::get_text(&reqwest::Client::new(), &format!("{}/metrics", server.base)).await;
    assert!(
        metrics.contains("settled_webhook_signature_failures_total{reason=\"no_match\"} 1"),
        "{metrics}"
    );
    drop(sim);
}

/// `event` signed with the test secret and posted to `server`: its status and answer.
async fn post_event(server: &Server, event: &Value) -> (u16, Value) {
    common::post_signed_event(&server.base, SECRET, event).await
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
    let made: Value = common::json_of(
        reqwest::Client::new()
            .post(format!("{}/v1/payouts", server.base))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", "awaiting-1")
            .json(&json!({ "creator": creator, "amount": "100", "confirm": true })),
    )
    .await;
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
