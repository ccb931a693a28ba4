//! The `/v1/queues` endpoints and the queue metrics: reads with any role, actions only with an operator's token.

use super::*;

async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
    let status = r.status().as_u16();
    if status >= 400 {
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    (status, r.json().await.unwrap())
}

/// Sends a request head that announces a body and never sends it; the answer.
async fn head_only(server: &Server, path: &str) -> String {
    let target = server.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&target).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_queue_endpoints_read_with_any_role_and_act_only_with_an_operators_token() {
    let env = queue_env().await;
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.base);

    let (status, all) = get(&client, &url("/v1/queues")).await;
    assert_eq!(status, 200);
    assert_eq!(all["queues"][0]["name"], "mail");
    assert_eq!(all["queues"][0]["stats"]["ready"], 3);
    let (status, one) = get(&client, &url("/v1/queues/mail")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&one["stats"]["scheduled"], &one["stats"]["failed"]),
        (&json!(2), &json!(2))
    );
    let (status, problem) = get(&client, &url("/v1/queues/nope")).await;
    assert_eq!((status, &problem["type"]), (404, &json!("/problems/unknown-queue")));
    let (status, dead) = get(&client, &url("/v1/queues/mail/dead")).await;
    assert_eq!(status, 200);
    let keys: Vec<&str> = dead["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["d2", "d1"]);
    assert_eq!(dead["dead_letters"][1]["last_error"], "smtp 550 mailbox <unknown>");
    assert_eq!(dead["dead_letters"][1]["history"][0]["attempt"], 1);
    let (status, problem) = get(&client, &url("/v1/queues/mail/dead?limit=0")).await;
    assert_eq!((status, &problem["field"]), (400, &json!("limit")));

    // Without the token (or with a wrong one) nothing changes; the token is
    // checked before the body is read.
    for token in [None, Some("wrong")] {
        for path in ["pause", "resume"] {
            assert_eq!(
                post(&client, &url(&format!("/v1/queues/mail/{path}")), token, None)
                    .await
                    .0,
                401
            );
        }
        let (status, _) = post(&client, &url("/v1/queues/mail/replay"), token, Some("{}")).await;
        assert_eq!(status, 401);
        let (status, _) = post(&client, &url("/v1/queues/mail/cancel"), token, Some(r#"{"key":"r2"}"#)).await;
        assert_eq!(status, 401);
    }
    for path in [
        "/v1/queues/mail/replay",
        "/v1/queues/mail/cancel",
        "/dashboard/queues/mail/replay",
    ] {
        let answer = head_only(&server, path).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
    }
    assert!(!paused(&env).await);
    assert_eq!(status_of(&env, "r2").await, "eligible");
    assert_eq!(status_of(&env, "d1").await, "failed");

    let token = Some(TOKEN);
    let (status, body) = post(&client, &url("/v1/queues/mail/pause"), token, None).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "paused": true, "changed": true}))
    );
    assert!(paused(&env).await);
    let (_, body) = post(&client, &url("/v1/queues/mail/pause"), token, None).await;
    assert_eq!(body["changed"], false);
    assert_eq!(
        env.scalar_text(
            "SELECT string_agg(outcome, ', ' ORDER BY id) FROM settlement.audit_log
             WHERE action = 'POST /v1/queues/{name}/pause'"
        )
        .await,
        "ok, no change: already paused",
        "the audit log says which pause changed nothing"
    );
    let (status, body) = post(&client, &url("/v1/queues/mail/resume"), token, None).await;
    assert_eq!((status, &body["changed"]), (200, &json!(true)));
    assert!(!paused(&env).await);
    let (status, problem) = post(&client, &url("/v1/queues/nope/pause"), token, None).await;
    assert_eq!((status, &problem["type"]), (404, &json!("/problems/unknown-queue")));

    // Replay: bodies refused with the field named, a filter that matches
    // nothing, one by key, then the rest.
    let replay = url("/v1/queues/mail/replay");
    for (body, status, kind, field) in [
        (r#"{"key":"d1","key":"d2"}"#, 400, "duplicate-field", "key"),
        (r#"{"nope":1}"#, 400, "malformed-json", "nope"),
        (r#"{"failed_since":"yesterday"}"#, 422, "invalid-field", "failed_since"),
        (r#"{"limit":0}"#, 422, "invalid-field", "limit"),
    ] {
        let (got, problem) = post(&client, &replay, token, Some(body)).await;
        assert_eq!(
            (got, &problem["type"]),
            (status, &json!(format!("/problems/{kind}"))),
            "{body}: {problem}"
        );
        assert_eq!(problem["field"], field, "{problem}");
    }
    let (status, problem) = post(&client, &replay, token, Some(r#"{"error_contains":"refused"}"#)).await;
    assert_eq!(
        (status, &problem["type"]),
        (404, &json!("/problems/no-dead-letter-matched"))
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM jobs.mail WHERE status = 'failed'")
            .await,
        2
    );
    let (status, body) = post(&client, &replay, token, Some(r#"{"key":"d1"}"#)).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "replayed": 1, "limit_reached": false}))
    );
    assert_eq!(status_of(&env, "d1").await, "eligible");
    let (status, body) = post(&client, &replay, token, Some(r#"{"limit":1}"#)).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "replayed": 1, "limit_reached": true}))
    );
    assert_eq!(status_of(&env, "d2").await, "eligible");

    // Cancel.
    let cancel = url("/v1/queues/mail/cancel");
    let (status, body) = post(&client, &cancel, token, Some(r#"{"key":"r2"}"#)).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "key": "r2", "cancelled": true}))
    );
    assert_eq!(status_of(&env, "r2").await, "cancelled");
    let (status, problem) = post(&client, &cancel, token, Some(r#"{"key":"p1"}"#)).await;
    assert_eq!(
        (status, &problem["type"]),
        (409, &json!("/problems/job-started")),
        "{problem}"
    );
    let (status, problem) = post(&client, &cancel, token, Some(r#"{"key":"zzz"}"#)).await;
    assert_eq!((status, &problem["type"]), (404, &json!("/problems/unknown-job")));
    let (status, problem) = post(&client, &cancel, token, Some(r#"{}"#)).await;
    assert_eq!((status, &problem["field"]), (400, &json!("key")), "{problem}");

    // A queue whose table is missing: listed with its error, its verbs 409.
    register_ghost(&env).await;
    let (_, all) = get(&client, &url("/v1/queues")).await;
    assert!(
        all["queues"][0]["error"].as_str().unwrap().contains("jobs.ghost"),
        "{all}"
    );
    let (status, problem) = post(&client, &url("/v1/queues/ghost/replay"), token, Some("{}")).await;
    assert_eq!((status, &problem["type"]), (409, &json!("/problems/queue-unusable")));

    let (_, doc) = get(&client, &url("/openapi.json")).await;
    for path in [
        "/v1/queues",
        "/v1/queues/{name}/dead",
        "/v1/queues/{name}/replay",
        "/v1/queues/{name}/cancel",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_give_each_queues_depth_oldest_ready_age_and_pause_at_scrape_time() {
    let env = queue_env().await;
    register_ghost(&env).await;
    let server = env.serve(TOKEN).await;
    let scrape = || async {
        let text = reqwest::get(format!("{}/metrics", server.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text");
        (text, parsed)
    };
    let value = |scrape: &(String, prometheus_parse::Scrape), name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        scrape
            .1
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    let depth = |s: &(String, prometheus_parse::Scrape), state: &str| {
        value(s, "work_queue_depth", &[("queue", "mail"), ("state", state)]).unwrap_or_else(|| panic!("{}", s.0))
    };
    let first = scrape().await;
    assert_eq!(
        ["ready", "scheduled", "processing", "failed"].map(|st| depth(&first, st)),
        [3.0, 2.0, 1.0, 2.0]
    );
    assert!(value(&first, "work_queue_oldest_ready_seconds", &[("queue", "mail")]).unwrap() >= 90.0);
    assert_eq!(value(&first, "work_queue_paused", &[("queue", "mail")]), Some(0.0));
    // The queue without a table: its pause, and no depth at all.
    assert_eq!(value(&first, "work_queue_paused", &[("queue", "ghost")]), Some(0.0));
    assert_eq!(
        value(&first, "work_queue_depth", &[("queue", "ghost")]),
        None,
        "{}",
        first.0
    );

    // s1's time has come (made so in SQL), the queue is paused, and a
    // ready job is cancelled: the next scrape says so.
    sqlx::query("UPDATE jobs.mail SET not_before = now() - interval '1 second' WHERE key = 's1'")
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(queues(&env, &["pause", "mail"]).0, 0);
    assert_eq!(queues(&env, &["cancel", "mail", "--key", "r2"]).0, 0);
    let second = scrape().await;
    assert_eq!(
        ["ready", "scheduled", "processing", "failed"].map(|st| depth(&second, st)),
        [3.0, 1.0, 1.0, 2.0]
    );
    assert_eq!(value(&second, "work_queue_paused", &[("queue", "mail")]), Some(1.0));
}
