//! The API edge: auth, media types, keys, duplicated fields and bad requests as problems naming the field.

use super::*;

/// The edge as the standards read: the Bearer scheme in any case, a 401
/// with its challenge, JSON only as `application/json` and only as an
/// object, and Idempotency-Key as the draft's sf-string (the bare form is the
/// same key; two headers are refused).
#[tokio::test(flavor = "multi_thread")]
async fn the_api_edge_reads_auth_media_types_and_keys_as_the_standards_say() {
    let (env, creators) = settled_env("5").await;
    let server = serve(&env).await;
    let creator = creators[0].0.clone();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/payouts", server.base);
    let body = json!({ "creator": creator, "amount": "7" }).to_string();
    let send = |auth: &str, content_type: &str, keys: &[&str], body: String| {
        let mut request = client
            .post(&url)
            .header("Authorization", auth.to_string())
            .header("Content-Type", content_type.to_string());
        for key in keys {
            request = request.header("Idempotency-Key", key.to_string());
        }
        request.body(body).send()
    };
    let lower = format!("bearer {TOKEN}");
    let r = send(&lower, "application/json", &["\"sf-key\""], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    // The bare form of the same key is the same request: replayed, not paid again.
    let bearer = format!("Bearer {TOKEN}");
    let r = send(&bearer, "application/json; charset=utf-8", &["sf-key"], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(r.headers().contains_key("idempotent-replayed"));
    let paid = format!("SELECT count(*) FROM settlement.payouts WHERE creator = '{creator}'");
    assert_eq!(env.scalar_i64(&paid).await, 1);

    let r = send("Bearer wrong", "application/json", &["w"], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer realm=\"settled\"");
    let r = send(&bearer, "text/plain", &["t"], body.clone()).await.unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let form = format!("creator={creator}&amount=7");
    let r = send(&bearer, "application/x-www-form-urlencoded", &["f"], form)
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let array = json!([creator, "7"]).to_string();
    let r = send(&bearer, "application/json", &["a"], array).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = send(&bearer, "application/json", &["one", "two"], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["field"], "Idempotency-Key", "{problem}");
    let r = send(&bearer, "application/json", &["\"unterminated"], body)
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(env.scalar_i64(&paid).await, 1, "no refused request paid anything");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_field_named_twice_is_refused_naming_it_never_the_last_one_taken() {
    let (env, creators) = settled_env("5").await;
    let server = serve(&env).await;
    let creator = &creators[0].0;
    let client = reqwest::Client::new();
    let send = |path: &str, key: &str, body: String| {
        client
            .post(format!("{}{path}", server.base))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let cases = [
        (
            "/v1/payouts",
            format!(r#"{{"creator":"{creator}","amount":"1","amount":"7"}}"#),
            "amount",
        ),
        (
            "/v1/payouts",
            format!(r#"{{"amount":"1","creator":"{creator}","creator":"{creator}"}}"#),
            "creator",
        ),
        (
            "/v1/holds",
            format!(r#"{{"creator":"{creator}","reason":"a","reason":"b"}}"#),
            "reason",
        ),
    ];
    for (i, (path, body, field)) in cases.into_iter().enumerate() {
        let r = send(path, &format!("twice-{i}"), body.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["type"], "/problems/duplicate-field", "{problem}");
        assert_eq!(problem["field"], field, "{problem}");
    }
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 0);
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.creator_holds").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_problems_that_name_the_field() {
    let (env, creators) = settled_env("5").await;
    let server = serve(&env).await;
    let creator = creators[0].0.clone();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/payouts", server.base);
    let cases: Vec<(Option<&str>, Value, u16, &str)> = vec![
        (Some("k"), json!({ "creator": creator, "amount": "abc" }), 422, "amount"),
        (Some("k"), json!({ "creator": creator, "amount": "0" }), 422, "amount"),
        (Some("k"), json!({ "creator": creator, "amount": "-5" }), 422, "amount"),
        (
            Some("k"),
            json!({ "creator": creator, "amount": "1".repeat(80) }),
            422,
            "amount",
        ),
        (Some("k"), json!({ "creator": "0x123", "amount": "5" }), 422, "creator"),
        (
            Some("k"),
            json!({ "creator": creator, "amount": "5", "note": "x" }),
            400,
            "note",
        ),
        (Some("k"), json!({ "creator": creator }), 400, "amount"),
        // A value of the wrong type names its field, not itself.
        (Some("k"), json!({ "creator": creator, "amount": 1 }), 400, "amount"),
        (Some("k"), json!({ "creator": 7, "amount": "5" }), 400, "creator"),
        (
            None,
            json!({ "creator": creator, "amount": "5" }),
            400,
            "Idempotency-Key",
        ),
    ];
    for (key, body, status, field) in cases {
        let (got, problem, _) = post(&client, &url, key, &body).await;
        assert_eq!(
            (got, problem["field"].as_str()),
            (status, Some(field)),
            "{body}: {problem}"
        );
    }
    let long_key = "k".repeat(256);
    let (got, problem, _) = post(
        &client,
        &url,
        Some(&long_key),
        &json!({ "creator": creator, "amount": "5" }),
    )
    .await;
    assert_eq!((got, problem["field"].as_str()), (400, Some("Idempotency-Key")));
    // Malformed JSON, no token, unknown creator.
    let r = client
        .post(&url)
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "m")
        .header("Content-Type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .post(&url)
        .header("Idempotency-Key", "n")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let unknown = "0x00000000000000000000000000000000000000ff";
    let (got, problem, _) = post(&client, &url, Some("u"), &json!({ "creator": unknown, "amount": "5" })).await;
    assert_eq!(
        (got, problem["type"].as_str()),
        (404, Some("/problems/unknown-creator"))
    );
    let r = client
        .get(format!("{}/v1/creators/{unknown}", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = client
        .get(format!("{}/v1/creators/nope", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .get(format!("{}/v1/creators/{creator}", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let big = "x".repeat(20_000);
    let r = client
        .post(&url)
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "big")
        .header("Content-Type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let doc: Value = common::json_of(client.get(format!("{}/openapi.json", server.base))).await;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payouts").await,
        0,
        "nothing half written"
    );
}
