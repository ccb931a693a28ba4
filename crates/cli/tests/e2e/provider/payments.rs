//! The client against the simulator: new payments, replays, key conflicts, faults, pages, bad requests, traceparent.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_new_payment_answers_201_and_a_replay_200_with_the_same_payment() {
    let sim = ProviderSim::start(&[]);
    let provider = client(&sim);
    let (first, created) = provider
        .pay("k-1", "0xc1", amount("250000000000000000000"), Some("payout-7"))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(
        (
            first.idempotency_key.as_str(),
            first.creator.as_str(),
            first.amount.as_str()
        ),
        ("k-1", "0xc1", "250000000000000000000")
    );
    assert_eq!(
        (first.status, first.reference.as_deref()),
        (PaymentStatus::Pending, Some("payout-7"))
    );
    let (again, created) = provider
        .pay("k-1", "0xc1", amount("250000000000000000000"), Some("payout-7"))
        .await
        .unwrap();
    assert!(!created, "a replay is answered 200");
    assert_eq!(again.id, first.id);
    // The same amount written with leading zeros is the same body.
    let raw = reqwest::Client::new()
        .post(format!("{}/v1/payments", sim.url))
        .header("Idempotency-Key", "k-1")
        .json(&json!({"creator": "0xc1", "amount": "000250000000000000000000", "reference": "payout-7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    let counters = sim.counters().await;
    assert_eq!(
        (counters["applied"].as_u64(), counters["replayed"].as_u64()),
        (Some(1), Some(2))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_used_again_with_another_body_is_a_key_conflict_and_pays_nothing_more() {
    let sim = ProviderSim::start(&[]);
    let provider = client(&sim);
    provider.pay("k-1", "0xc1", amount("1000"), Some("r")).await.unwrap();
    for (creator, amount_text, reference) in [
        ("0xc1", "999", Some("r")),
        ("0xc2", "1000", Some("r")),
        ("0xc1", "1000", None),
    ] {
        let answer = provider.pay("k-1", creator, amount(amount_text), reference).await;
        assert!(
            matches!(answer, Err(ProviderError::KeyConflict(ref text)) if text.starts_with("422")),
            "{creator} {amount_text} {reference:?}: {answer:?}"
        );
    }
    assert_eq!(provider.list_all().await.unwrap().len(), 1);
    assert_eq!(sim.counters().await["conflicts"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limited_call_is_rate_limited_for_the_retry_after_and_applies_nothing() {
    let sim = ProviderSim::start(&["--rate-limit-rate", "1", "--retry-after-secs", "7"]);
    let provider = client(&sim);
    let seven = ProviderError::RateLimited {
        retry_after: Duration::from_secs(7),
    };
    assert_eq!(pay(&provider, "k-1", "5").await.unwrap_err(), seven);
    assert_eq!(provider.lookup("k-1").await.unwrap_err(), seven);
    let raw = reqwest::get(format!("{}/v1/payments?limit=5", sim.url)).await.unwrap();
    assert_eq!(
        (raw.status().as_u16(), raw.headers()["retry-after"].to_str().unwrap()),
        (429, "7")
    );
    set_faults(&sim, json!({})).await;
    assert_eq!(provider.lookup("k-1").await.unwrap(), None, "nothing was applied");
    assert!(pay(&provider, "k-1", "5").await.unwrap().1);
    assert_eq!(sim.counters().await["rate_limited"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_stays_the_keys_answer_and_nothing_is_paid() {
    let sim = ProviderSim::start(&["--refusal-rate", "1"]);
    let provider = client(&sim);
    let refused = pay(&provider, "k-1", "5").await.unwrap_err();
    assert!(
        matches!(refused, ProviderError::Refused(ref text) if text.starts_with("402") && text.contains("payment refused")),
        "{refused:?}"
    );
    set_faults(&sim, json!({})).await;
    assert_eq!(
        pay(&provider, "k-1", "5").await.unwrap_err(),
        refused,
        "the key's answer is kept"
    );
    assert_eq!(provider.lookup("k-1").await.unwrap(), None);
    assert!(pay(&provider, "k-2", "5").await.unwrap().1, "a new key is paid");
    let counters = sim.counters().await;
    assert_eq!(
        (counters["refused"].as_u64(), counters["applied"].as_u64()),
        (Some(2), Some(1))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_503_and_a_late_answer_are_transient_and_the_retry_under_the_key_is_a_replay() {
    let sim = ProviderSim::start(&["--error-rate", "1"]);
    let provider = client(&sim);
    let unavailable = pay(&provider, "k-1", "5").await.unwrap_err();
    assert!(
        matches!(unavailable, ProviderError::Transient(ref t) if t.starts_with("503")),
        "{unavailable:?}"
    );
    assert_eq!(provider.lookup("k-1").await.unwrap(), None, "a 503 applies nothing");

    set_faults(&sim, json!({"applied_timeout_rate": 1.0, "applied_timeout_ms": 3000})).await;
    let impatient = HttpProvider::new(&sim.url, Duration::from_millis(300)).unwrap();
    let late = pay(&impatient, "k-1", "5").await.unwrap_err();
    assert!(
        matches!(late, ProviderError::Transient(ref t) if t.starts_with("timed out")),
        "{late:?}"
    );
    let applied = provider
        .lookup("k-1")
        .await
        .unwrap()
        .expect("applied before the answer timed out");

    set_faults(&sim, json!({})).await;
    let (again, created) = pay(&impatient, "k-1", "5").await.unwrap();
    assert_eq!((again.id, created), (applied.id, false));
    let counters = sim.counters().await;
    assert_eq!(
        [
            &counters["injected_errors"],
            &counters["applied_then_timed_out"],
            &counters["applied"]
        ],
        [1, 1, 1]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payment_is_pending_then_paid_or_failed_and_lookup_follows() {
    // Ten minutes: this one stays pending for the whole test.
    let sim = ProviderSim::start(&["--settle-delay-ms", "600000"]);
    let provider = client(&sim);
    let (pending, created) = pay(&provider, "k-pending", "4").await.unwrap();
    assert_eq!((pending.status, created), (PaymentStatus::Pending, true));
    let looked_up = provider.lookup("k-pending").await.unwrap().unwrap();
    assert_eq!(
        (looked_up.status, looked_up.failure_reason),
        (PaymentStatus::Pending, None)
    );

    set_faults(&sim, json!({})).await;
    let (accepted, _) = pay(&provider, "k-paid", "5").await.unwrap();
    assert_eq!(accepted.status, PaymentStatus::Pending, "accepted first, paid after");
    let paid = final_payment(&provider, "k-paid").await;
    assert_eq!((paid.status, paid.failure_reason), (PaymentStatus::Paid, None));

    set_faults(&sim, json!({"failure_rate": 1.0})).await;
    let (accepted, _) = pay(&provider, "k-failed", "6").await.unwrap();
    assert_eq!(accepted.status, PaymentStatus::Pending);
    let failed = final_payment(&provider, "k-failed").await;
    assert_eq!(failed.status, PaymentStatus::Failed);
    assert!(failed.failure_reason.is_some_and(|r| !r.is_empty()));

    let counters = sim.counters().await;
    assert_eq!(
        [
            &counters["paid"],
            &counters["failed"],
            &counters["events"],
            &counters["webhooks_unsent"]
        ],
        [1, 1, 2, 2],
        "no endpoint, so the events were not sent: {counters}"
    );
    let pending = provider.lookup("k-pending").await.unwrap().unwrap();
    assert_eq!(pending.status, PaymentStatus::Pending);
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_list_every_payment_once_in_rising_id_order() {
    let sim = ProviderSim::start(&[]);
    let provider = client(&sim);
    let mut keys = HashSet::new();
    for i in 0..25 {
        let key = format!("k-{i}");
        pay(&provider, &key, "1").await.unwrap();
        keys.insert(key);
    }
    let first = provider.list_page(None, 10).await.unwrap();
    let second = provider.list_page(Some(&first[9].id), 10).await.unwrap();
    let third = provider.list_page(Some(&second[9].id), 10).await.unwrap();
    assert_eq!((first.len(), second.len(), third.len()), (10, 10, 5));
    assert!(provider.list_page(Some(&third[4].id), 10).await.unwrap().is_empty());
    let all = provider.list_all().await.unwrap();
    let paged: Vec<&Payment> = first.iter().chain(&second).chain(&third).collect();
    assert_eq!(all.iter().collect::<Vec<_>>(), paged);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "rising ids");
    assert_eq!(
        all.iter().map(|p| p.idempotency_key.clone()).collect::<HashSet<_>>(),
        keys
    );

    assert!(provider.list_page(None, 0).await.is_err());
    assert!(provider.list_page(None, 1_001).await.is_err());
    for query in [
        "limit=0",
        "limit=1001",
        "limit=ten",
        "idempotency_key=k-1&limit=3",
        "bogus=1",
    ] {
        let raw = reqwest::get(format!("{}/v1/payments?{query}", sim.url)).await.unwrap();
        assert_eq!(raw.status(), 400, "{query}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_requests_answer_400_naming_what_is_wrong_never_422() {
    let sim = ProviderSim::start(&[]);
    let http = reqwest::Client::new();
    for (key, body, why) in [
        (
            None,
            json!({"creator": "0xc1", "amount": "5"}),
            "missing Idempotency-Key",
        ),
        (
            Some("k"),
            json!({"creator": "0xc1", "amount": "1.5"}),
            "amount must be a whole number",
        ),
        (Some("k"), json!({"creator": "0xc1", "amount": 5}), "body: invalid type"),
        (
            Some("k"),
            json!({"creator": "0xc1", "amount": "5", "memo": "x"}),
            "body: unknown field `memo`",
        ),
        (
            Some("k"),
            json!({"creator": "", "amount": "5"}),
            "creator must be 1..=255 characters",
        ),
    ] {
        let mut request = http.post(format!("{}/v1/payments", sim.url)).json(&body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert!(error["error"].as_str().unwrap().starts_with(why), "{body}: {error}");
    }
    assert_eq!(sim.counters().await["bad_requests"], 5);
}

#[test]
fn bad_flags_and_bad_faults_are_refused_by_name() {
    for (flags, why) in [
        (
            vec!["--failure-rate", "2"],
            "--failure-rate must be within 0..=1, not 2",
        ),
        (
            vec!["--webhook-loss-rate=-0.5"],
            "--webhook-loss-rate must be within 0..=1",
        ),
        (vec!["--webhook-url", "http://127.0.0.1:9"], "--webhook-secret"),
        (
            vec!["--webhook-url", "ftp://x", "--webhook-secret", "s"],
            "the webhook URL \"ftp://x\" must be an http:// URL",
        ),
    ] {
        let out = std::process::Command::new(SETTLED)
            .args(["provider-sim", "--port", "0"])
            .args(&flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(why), "{flags:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_that_break_a_limit_are_refused_by_name_and_change_nothing() {
    let sim = ProviderSim::start(&["--latency-ms", "1"]);
    let http = reqwest::Client::new();
    for (body, status, why) in [
        (json!({"failure_rate": 2}), 422, "failure_rate must be within 0..=1"),
        (
            json!({"error_rate": 0.7, "rate_limit_rate": 0.7}),
            422,
            "rate_limit_rate + error_rate",
        ),
        (json!({"failure_rates": 0.5}), 400, "unknown field `failure_rates`"),
    ] {
        let response = http
            .post(format!("{}/v1/faults", sim.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{body}");
        let error: Value = response.json().await.unwrap();
        assert!(error["error"].as_str().unwrap().contains(why), "{body}: {error}");
    }
    let faults: Value = reqwest::get(format!("{}/v1/faults", sim.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&faults["latency_ms"], &faults["failure_rate"]),
        (&json!(1), &json!(0.0))
    );
}

/// A provider double that records each request's traceparent (the
/// simulator does not expose request headers) and answers as the protocol says.
async fn traceparent_recorder() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let record = |seen: Arc<Mutex<Vec<Option<String>>>>, headers: &HeaderMap| {
        let value = headers.get("traceparent").map(|v| v.to_str().unwrap().to_string());
        seen.lock().unwrap().push(value);
    };
    let payment = json!({"id": "pay_1", "idempotency_key": "k", "creator": "0xc1", "amount": "1", "status": "pending"});
    let (on_post, on_get) = (seen.clone(), seen.clone());
    let answer = payment.clone();
    let app = Router::new().route(
        "/v1/payments",
        post(move |headers: HeaderMap| async move {
            record(on_post, &headers);
            (StatusCode::CREATED, axum::Json(answer))
        })
        .get(move |headers: HeaderMap, query: axum::extract::RawQuery| async move {
            record(on_get, &headers);
            if query.0.unwrap_or_default().contains("idempotency_key") {
                axum::Json(payment)
            } else {
                axum::Json(json!([]))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_sends_the_traceparent_it_is_given_on_every_request() {
    let (url, seen) = traceparent_recorder().await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let plain = HttpProvider::new(&url, Duration::from_secs(5)).unwrap();
    let traced = plain.with_traceparent(Some(trace));
    traced.pay("k", "0xc1", amount("1"), None).await.unwrap();
    traced.lookup("k").await.unwrap();
    traced.list_all().await.unwrap();
    plain.pay("k", "0xc1", amount("1"), None).await.unwrap();
    plain.with_traceparent(Some("not-a-trace")).lookup("k").await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let trace = Some(trace.to_string());
    assert_eq!(seen, [trace.clone(), trace.clone(), trace, None, None]);
}
