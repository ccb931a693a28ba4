//! Webhooks with bad signatures are refused before their body; events settled cannot apply are stored and answered 200.

use super::*;

const WEBHOOK_SECRET: &str = "whsec-hostile";

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_with_a_bad_or_stale_signature_header_are_refused_before_their_body_while_healthz_answers() {
    let env = Env::new().await;
    let server = serve_capped(&env, "64", "120000", &["--provider-webhook-secret", WEBHOOK_SECRET]).await;
    let target = addr(&server);
    let now = chrono::Utc::now().timestamp();
    let v1 = "ab".repeat(32);
    let headers = [
        format!("t={},v1={v1}", now - 3_600),
        format!("t={},v1={v1}", now + 3_600),
        format!("t={now},v1=not-hex"),
        format!("t={now}"),
        "v1=abc".to_string(),
    ];
    // More clients than the cap, each sending a head whose signature header
    // can be judged alone, announcing a body it never sends.
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..100 {
        let signature = headers[i % headers.len()].clone();
        let head = format!(
            "POST /v1/provider-events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nProvider-Signature: {signature}\r\nContent-Length: 1000\r\n\r\n"
        );
        let target = target.clone();
        clients.spawn(async move { (signature, answer_to_head(&target, &head, Duration::from_secs(60)).await) });
    }
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "/healthz behind 100 webhooks with bad signature headers at a cap of 64"
    );
    while let Some(done) = clients.join_next().await {
        let (signature, answer) = done.unwrap();
        let answer = answer.unwrap_or_else(|| panic!("{signature}: no answer within 60 s"));
        assert!(
            answer.starts_with("HTTP/1.1 400") && answer.contains("/problems/bad-signature"),
            "{signature}: answered without its body: {answer}"
        );
    }
    let failures = metric(
        &server.base,
        "settled_webhook_signature_failures_total{reason=\"outside_tolerance\"}",
    )
    .await;
    assert_eq!(failures, 40.0, "stale and future timestamps counted");
    // A header that holds until the body is checked: the body has the
    // webhook's own short time limit, then 408 and the connection closes.
    let head = format!(
        "POST /v1/provider-events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nProvider-Signature: t={now},v1={v1}\r\nContent-Length: 1000\r\n\r\n"
    );
    let (answer, sent) = trickle_body(&target, &head, 1000).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert!(sent < 1000, "the trickle was read to its end");
    let answer = answer_to_head(&target, &head, Duration::from_secs(60))
        .await
        .expect("an answer");
    let limit = settled::api::provider_events::WEBHOOK_BODY_READ_TIMEOUT;
    assert!(limit < settled::api::BODY_READ_TIMEOUT);
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains(&format!("within {} ms", limit.as_millis())),
        "the webhook's own body limit: {answer}"
    );
}

/// Posts `body` to the webhook route signed with the test's secret.
async fn post_event(base: &str, body: &Value) -> (u16, Value) {
    common::post_signed_event(base, WEBHOOK_SECRET, body).await
}

#[tokio::test(flavor = "multi_thread")]
async fn signed_events_settled_cannot_apply_are_stored_ignored_and_answered_200_so_the_provider_stops_sending() {
    let env = Env::new().await;
    let server = env
        .serve_with(TOKEN, &["--provider-webhook-secret", WEBHOOK_SECRET])
        .await;
    let b = &server.base;
    let payment = json!({ "id": "pay_1", "idempotency_key": "payout-999999", "amount": "5",
        "creator": format!("0x{}", "1".repeat(40)), "status": "paid" });
    let stored = |id: String| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_as::<_, (String, String, Option<String>, i64)>(
                "SELECT type, outcome, detail, count(*) OVER () FROM settlement.provider_events WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };
    let digest = |text: String| {
        let pool = env.pool.clone();
        async move {
            let hex: String = sqlx::query_scalar("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')")
                .bind(text)
                .fetch_one(&pool)
                .await
                .unwrap();
            format!("sha256:{hex}")
        }
    };
    // A type settled does not know: kept, ignored, and its repeat a duplicate.
    let refund = json!({ "id": "ev-refund", "type": "payment.refunded", "created": 1, "data": payment });
    let (status, body) = post_event(b, &refund).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ignored")), "{body}");
    let (kind, outcome, detail, _) = stored("ev-refund".into()).await.expect("stored");
    assert_eq!((kind.as_str(), outcome.as_str()), ("payment.refunded", "ignored"));
    assert!(detail.unwrap_or_default().contains("payment.refunded"));
    let (status, body) = post_event(b, &refund).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    // A type longer than the column takes is kept by its digest.
    let long_type = "x".repeat(150);
    let odd = json!({ "id": "ev-odd", "type": long_type, "created": 1 });
    let (status, body) = post_event(b, &odd).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ignored")), "{body}");
    let (kind, _, _, _) = stored("ev-odd".into()).await.expect("stored");
    assert_eq!(kind, digest(long_type).await);
    // An id longer than 255 characters is kept by its digest, applied as
    // any event is, and a repeat of it is a duplicate.
    let long_id = "e".repeat(300);
    let paid = json!({ "id": long_id, "type": "payment.paid", "created": 1, "data": payment });
    let (status, body) = post_event(b, &paid).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("unknown_payout")),
        "{body}"
    );
    let key = digest(long_id.clone()).await;
    assert_eq!(body["id"], key.as_str(), "{body}");
    let (_, outcome, _, rows) = stored(key.clone()).await.expect("stored under its digest");
    assert_eq!((outcome.as_str(), rows), ("unknown_payout", 1));
    let (status, body) = post_event(b, &paid).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    // An empty id names nothing a repeat could be matched by: ignored, kept
    // under the digest of its body.
    let nameless = json!({ "id": "", "type": "payment.paid", "created": 1, "data": payment });
    let (status, body) = post_event(b, &nameless).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ignored")), "{body}");
    let key = format!(
        "body-{}",
        digest(String::from_utf8(serde_json::to_vec(&nameless).unwrap()).unwrap()).await
    );
    assert_eq!(body["id"], key.as_str(), "{body}");
    let (_, outcome, detail, _) = stored(key).await.expect("stored under its body's digest");
    assert_eq!(outcome, "ignored");
    assert!(detail.unwrap_or_default().contains("empty"));
    let (status, body) = post_event(b, &nameless).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    // The signature still comes first.
    let r = reqwest::Client::new()
        .post(format!("{b}/v1/provider-events"))
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&refund).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.provider_events").await,
        4,
        "each event stored once"
    );
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 0);
}
