//! The simulator's webhooks: signed, retried until acknowledged, rotated secrets, duplicated and lost, seeded choices.

use super::*;

/// One POST the receiver got.
#[derive(Debug, Clone)]
struct Received {
    event: WebhookEvent,
    verified: Result<(), SignatureError>,
    answered: u16,
}

/// A webhook receiver: verifies each POST with the real `verify` against
/// `secrets`, answers 400 when it does not verify, and 500 to the first
/// `refuse_first` valid sends of each event (so the sender tries again).
#[derive(Clone)]
struct Receiver {
    secrets: Arc<Mutex<Vec<Vec<u8>>>>,
    refuse_first: usize,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start(secrets: &[&str], refuse_first: usize) -> (Receiver, String) {
        let receiver = Receiver {
            secrets: Arc::new(Mutex::new(secrets.iter().map(|s| s.as_bytes().to_vec()).collect())),
            refuse_first,
            received: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/provider-events", listener.local_addr().unwrap());
        let app = Router::new()
            .route("/v1/provider-events", post(receive))
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// The events acknowledged (2xx), each as often as it was.
    fn acknowledged(&self) -> Vec<WebhookEvent> {
        self.received()
            .into_iter()
            .filter(|r| r.answered == 200)
            .map(|r| r.event)
            .collect()
    }
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let now = chrono::Utc::now().timestamp();
    let verified = verify(header, &body, &receiver.secrets.lock().unwrap(), now, DEFAULT_TOLERANCE);
    let event: WebhookEvent = serde_json::from_slice(&body).expect("the body is an event");
    let mut received = receiver.received.lock().unwrap();
    let valid_before = received
        .iter()
        .filter(|r| r.event.id == event.id && r.verified.is_ok())
        .count();
    let answered = match &verified {
        Err(_) => 400,
        Ok(()) if valid_before < receiver.refuse_first => 500,
        Ok(()) => 200,
    };
    received.push(Received {
        event,
        verified,
        answered,
    });
    StatusCode::from_u16(answered).unwrap()
}

async fn settle_all(provider: &HttpProvider, keys: &[String]) -> HashMap<String, Payment> {
    let mut payments = HashMap::new();
    for key in keys {
        payments.insert(key.clone(), final_payment(provider, key).await);
    }
    payments
}

async fn counter(sim: &ProviderSim, name: &str) -> u64 {
    sim.counters().await[name].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_paid_or_failed_payment_sends_a_signed_webhook_that_verifies() {
    let (receiver, url) = Receiver::start(&["whsec-1"], 0).await;
    let sim = ProviderSim::start(&[
        "--webhook-url",
        &url,
        "--webhook-secret",
        "whsec-1",
        "--failure-rate",
        "0.5",
        "--seed",
        "3",
    ]);
    let provider = client(&sim);
    let keys: Vec<String> = (0..20).map(|i| format!("k-{i}")).collect();
    for key in &keys {
        pay(&provider, key, "100").await.unwrap();
    }
    let payments = settle_all(&provider, &keys).await;
    wait_until(30, "20 webhooks acknowledged", || async {
        counter(&sim, "webhooks_delivered").await == 20
    })
    .await;

    let events = receiver.acknowledged();
    assert!(receiver.received().iter().all(|r| r.verified.is_ok()));
    assert_eq!(
        events.iter().map(|e| &e.id).collect::<HashSet<_>>().len(),
        20,
        "one event each"
    );
    for event in &events {
        let payment = &payments[&event.data.idempotency_key];
        assert_eq!(&event.data, payment, "the event carries the payment as it ended");
        assert_eq!(event.r#type.status(), payment.status);
    }
    let failed = events.iter().filter(|e| e.r#type == EventType::PaymentFailed).count();
    assert!((1..20).contains(&failed), "{failed} of 20 failed at 0.5");
    let counters = sim.counters().await;
    assert_eq!(
        [
            &counters["events"],
            &counters["webhooks_delivered"],
            &counters["webhook_attempts"]
        ],
        [20, 20, 20],
        "{counters}"
    );
    assert_eq!(counters["failed"], failed as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_is_sent_again_until_it_is_acknowledged() {
    let (receiver, url) = Receiver::start(&["s"], 2).await;
    let sim = ProviderSim::start(&[
        "--webhook-url",
        &url,
        "--webhook-secret",
        "s",
        "--webhook-retry-base-ms",
        "20",
    ]);
    let provider = client(&sim);
    for i in 0..5 {
        pay(&provider, &format!("k-{i}"), "1").await.unwrap();
    }
    wait_until(30, "5 webhooks acknowledged", || async {
        counter(&sim, "webhooks_delivered").await == 5
    })
    .await;
    let received = receiver.received();
    assert_eq!(received.len(), 15, "each event answered 500 twice, then acknowledged");
    for event in receiver.acknowledged() {
        let sends: Vec<u16> = received
            .iter()
            .filter(|r| r.event.id == event.id)
            .map(|r| r.answered)
            .collect();
        assert_eq!(sends, [500, 500, 200], "{}", event.id);
    }
    let counters = sim.counters().await;
    assert_eq!(
        [
            &counters["webhook_attempts"],
            &counters["webhook_failures"],
            &counters["webhooks_delivered"]
        ],
        [15, 10, 5]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_rotated_at_run_time_signs_the_next_try() {
    let (receiver, url) = Receiver::start(&["new"], 0).await;
    let sim = ProviderSim::start(&[
        "--webhook-url",
        &url,
        "--webhook-secret",
        "old",
        "--webhook-retry-base-ms",
        "50",
        "--webhook-retry-max-ms",
        "200",
        "--webhook-attempts-max",
        "1000",
    ]);
    let provider = client(&sim);
    for i in 0..3 {
        pay(&provider, &format!("k-{i}"), "1").await.unwrap();
    }
    wait_until(30, "each event refused once", || async {
        receiver
            .received()
            .iter()
            .map(|r| r.event.id.clone())
            .collect::<HashSet<_>>()
            .len()
            == 3
    })
    .await;
    assert!(receiver
        .received()
        .iter()
        .all(|r| r.verified == Err(SignatureError::NoMatch) && r.answered == 400));

    let response = reqwest::Client::new()
        .post(format!("{}/v1/webhook-endpoint", sim.url))
        .json(&json!({"url": url, "secret": "new"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    wait_until(30, "3 webhooks acknowledged", || async {
        receiver.acknowledged().len() == 3
    })
    .await;
    let shown: Value = reqwest::get(format!("{}/v1/webhook-endpoint", sim.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown, json!({ "url": url }), "the secret is never shown");
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicated_held_back_and_lost_webhooks_are_counted_as_the_receiver_sees_them() {
    let (receiver, url) = Receiver::start(&["s"], 0).await;
    let sim = ProviderSim::start(&[
        "--webhook-url",
        &url,
        "--webhook-secret",
        "s",
        "--webhook-duplicate-rate",
        "0.3",
        "--webhook-reorder-rate",
        "0.5",
        "--webhook-reorder-max-ms",
        "1000",
        "--webhook-loss-rate",
        "0.2",
        "--seed",
        "11",
    ]);
    let provider = client(&sim);
    let keys: Vec<String> = (0..40).map(|i| format!("k-{i}")).collect();
    for key in &keys {
        pay(&provider, key, "1").await.unwrap();
    }
    settle_all(&provider, &keys).await;
    let lost = counter(&sim, "webhooks_lost").await;
    let duplicated = counter(&sim, "webhooks_duplicated").await;
    let sends = 40 - lost + duplicated;
    wait_until(30, "every send acknowledged", || async {
        counter(&sim, "webhooks_delivered").await == sends
    })
    .await;

    let events = receiver.acknowledged();
    assert!(receiver.received().iter().all(|r| r.verified.is_ok()));
    let distinct: HashSet<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(events.len() as u64, sends, "every send arrived once");
    assert_eq!(distinct.len() as u64, 40 - lost, "the lost events never arrived");
    assert!(lost > 0 && duplicated > 0, "lost {lost}, duplicated {duplicated}");
    let overtaken = events.windows(2).filter(|w| w[0].id > w[1].id).count();
    assert!(overtaken > 0, "held-back events arrive after later ones");
    assert!(counter(&sim, "webhooks_reordered").await > 0);
}

/// What happened to each key: refused, or paid, or failed with its reason.
async fn outcomes(seed: &str, keys: &[String]) -> Vec<String> {
    let sim = ProviderSim::start(&["--seed", seed, "--failure-rate", "0.5", "--refusal-rate", "0.2"]);
    let provider = client(&sim);
    let mut outcomes = Vec::new();
    for key in keys {
        outcomes.push(match pay(&provider, key, "1").await {
            Err(ProviderError::Refused(text)) => format!("refused: {text}"),
            Err(other) => panic!("{other:?}"),
            Ok(_) => {
                let payment = final_payment(&provider, key).await;
                format!("{}: {:?}", payment.status, payment.failure_reason)
            }
        });
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_seed_makes_the_same_choices() {
    let keys: Vec<String> = (0..30).map(|i| format!("k-{i}")).collect();
    let first = outcomes("5", &keys).await;
    assert_eq!(outcomes("5", &keys).await, first);
    assert_ne!(outcomes("6", &keys).await, first);
    for kind in ["refused", "paid", "failed"] {
        assert!(first.iter().any(|o| o.starts_with(kind)), "{kind} in {first:?}");
    }
}
