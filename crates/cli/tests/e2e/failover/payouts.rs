//! Payouts acknowledged, delivered or lost around an asynchronous or synchronous failover pay once.

use super::*;

/// The creators `sql` selects, read on the database at `url`.
async fn creators_on(url: &str, sql: &str) -> Vec<String> {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acknowledged_payout_can_vanish_in_an_asynchronous_failover_and_its_retry_pays_once() {
    let mut pair = start_pair(false);
    let url = multi_host_url(&pair);
    let creator = settle_then_cut_replication(&pair, &url).await;
    let server = api(&url, &[]).await;
    let (status, first) = pay(&server.base, "ack-1", &creator).await;
    assert_eq!(status, 201, "{first}");
    fail_over(&mut pair, &server).await;
    let new_url = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(
        count(&new_url, "SELECT count(*) FROM settlement.payouts").await,
        0,
        "the 201 was acknowledged by a primary whose commit the standby never got"
    );
    // The client retries with its key: one payout, on the new primary.
    let (status, again) = pay(&server.base, "ack-1", &creator).await;
    assert_eq!(status, 201, "{again}");
    let (status, replayed) = pay(&server.base, "ack-1", &creator).await;
    assert_eq!((status, &replayed["id"]), (201, &again["id"]));
    assert_eq!(count(&new_url, "SELECT count(*) FROM settlement.payouts").await, 1);
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_remote_apply_no_payout_is_acknowledged_before_the_standby_has_it() {
    let mut pair = start_pair(true);
    let url = multi_host_url(&pair);
    let creator = settle_then_cut_replication(&pair, &url).await;
    // The standby gets nothing now: a payout must not be answered 201, even
    // after the API's 5 s statement timeout (PostgreSQL would turn a
    // cancelled wait for the standby into a successful commit).
    let server = api(
        &url,
        &["--synchronous-commit", "remote-apply", "--request-timeout-ms", "7000"],
    )
    .await;
    let (status, answer) = pay(&server.base, "ack-2", &creator).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["type"], "/problems/request-timeout", "{answer}");
    fail_over(&mut pair, &server).await;
    let new_url = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(count(&new_url, "SELECT count(*) FROM settlement.payouts").await, 0);
    let (status, paid) = pay(&server.base, "ack-2", &creator).await;
    assert_eq!(status, 201, "{paid}");
    assert_eq!(count(&new_url, "SELECT count(*) FROM settlement.payouts").await, 1);
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}

/// A client making payouts one after another through `settled serve`,
/// retrying under the same key until each gets an answer; the keys of the
/// payouts answered 201.
async fn payout_stream(base: String, creators: Vec<String>, stream: usize, n: usize) -> Vec<(String, i64)> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut made = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    for i in 0..n {
        let key = format!("failover-payout-{stream}-{i}");
        loop {
            assert!(Instant::now() < deadline, "payout {key} got no answer");
            let sent = http
                .post(format!("{base}/v1/payouts"))
                .bearer_auth("t")
                .header("Idempotency-Key", &key)
                .json(&serde_json::json!({ "creator": creators[(i + stream) % creators.len()], "amount": "1000" }))
                .send()
                .await;
            match sent {
                Ok(r) if r.status() == 201 => {
                    let body: serde_json::Value = r.json().await.unwrap();
                    made.push((key, body["id"].as_i64().unwrap()));
                    break;
                }
                Ok(r) if r.status().is_client_error() && r.status() != 409 => {
                    panic!("payout {key}: {} {}", r.status(), r.text().await.unwrap_or_default())
                }
                // 5xx while the database is away, 409 while a try is in progress.
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    made
}

/// Payouts made and delivered while the primary crashes and the standby is
/// promoted (asynchronous replication): the API server and two `settled
/// deliver` processes follow the primary by themselves; the provider's
/// webhooks (some lost, some sent twice) and look-ups finish the payouts.
/// On the new primary every payout ends paid (one payment at the provider
/// under its key, of its amount) or failed and returned once, none stuck,
/// and verify holds. An acknowledged payout whose commit the standby never
/// got is gone with its debit; if it had reached the provider, its payment
/// is there under a key the new primary does not know (counted, for
/// reconciliation).
#[tokio::test(flavor = "multi_thread")]
async fn payouts_delivered_through_an_asynchronous_failover_end_paid_once_or_returned() {
    const SECRET: &str = "whsec-failover";
    const STREAMS: usize = 2;
    const PAYOUTS: usize = 400;
    let mut pair = start_pair(false);
    create_database(&pair).await;
    let url = multi_host_url(&pair);
    run_ok(&url, &["seed", "--period", PERIOD, "--creators", "100"]);
    run_ok(&url, &["worker", "--period", PERIOD]);
    let sim = ProviderSim::start(&[
        "--settle-delay-ms",
        "300",
        "--failure-rate",
        "0.1",
        "--webhook-loss-rate",
        "0.2",
        "--webhook-duplicate-rate",
        "0.2",
    ]);
    let server = api(&url, &["--provider-webhook-secret", SECRET]).await;
    sim.post_webhooks_to(&server, SECRET).await;
    let logs = tempfile::tempdir().unwrap();
    let mut deliverers: Vec<Child> = (0..2)
        .map(|i| {
            let log = std::fs::File::create(logs.path().join(format!("deliver-{i}.log"))).unwrap();
            settled(
                &url,
                &[
                    "deliver",
                    "--provider-url",
                    &sim.url,
                    "--provider-timeout-ms",
                    "1000",
                    "--lease-ttl-ms",
                    "2000",
                    "--rescue-interval-ms",
                    "500",
                    "--poll-after-secs",
                    "1",
                    "--max-poll-ms",
                    "200",
                    "--batch",
                    "10",
                    "--shutdown-grace-ms",
                    "1000",
                ],
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
        })
        .collect();
    let on_primary = pair.primary.as_ref().unwrap().url("settled");
    let creators = creators_on(
        &on_primary,
        "SELECT creator FROM settlement.creator_balance WHERE balance >= 1000000 ORDER BY creator",
    )
    .await;
    assert!(creators.len() >= 10, "creators with balances: {}", creators.len());
    let streams: Vec<_> = (0..STREAMS)
        .map(|s| {
            tokio::spawn(payout_stream(
                server.base.clone(),
                creators.clone(),
                s,
                PAYOUTS / STREAMS,
            ))
        })
        .collect();
    // Mid-stream, with deliveries under way: the primary crashes.
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(
        &on_primary,
        "SELECT count(*) FROM settlement.payouts WHERE status IN ('sent', 'paid', 'failed')",
    )
    .await
        < (PAYOUTS / 4) as i64
    {
        assert!(Instant::now() < deadline, "delivery did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let primary = pair.primary.take().unwrap();
    primary.crash().expect("crash the primary");
    pair.standby.as_ref().unwrap().promote().expect("promote the standby");
    let mut made = Vec::new();
    for stream in streams {
        made.extend(stream.await.unwrap());
    }
    let on_new = pair.standby.as_ref().unwrap().url("settled");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let open = count(
            &on_new,
            "SELECT count(*) FROM settlement.payouts WHERE status IN ('created', 'queued', 'sent')",
        )
        .await;
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} payouts not final on the new primary; deliverers' logs:\n{}",
            (0..2)
                .map(|i| std::fs::read_to_string(logs.path().join(format!("deliver-{i}.log"))).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, deliverer) in deliverers.iter_mut().enumerate() {
        kill(Pid::from_raw(deliverer.id() as i32), Signal::SIGTERM).unwrap();
        let status = tokio::task::block_in_place(|| wait_bounded(deliverer, 60));
        let log = std::fs::read_to_string(logs.path().join(format!("deliver-{i}.log"))).unwrap();
        assert!(status.success(), "deliverer {i} exited {status:?}:\n{log}");
    }
    let _ = primary.stop();

    let mut conn = PgConnection::connect(&on_new).await.unwrap();
    let payouts: Vec<(i64, String, String, String, String)> =
        sqlx::query_as("SELECT id, creator, amount::text, status, provider_key FROM settlement.payouts ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let returned: std::collections::HashMap<i64, String> =
        sqlx::query_as::<_, (i64, String)>("SELECT payout_id, amount::text FROM settlement.payout_returns")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let payments = provider.list_all().await.unwrap();
    let by_key: std::collections::HashMap<&str, &settled::provider::Payment> =
        payments.iter().map(|p| (p.idempotency_key.as_str(), p)).collect();
    assert_eq!(by_key.len(), payments.len(), "one payment per key at the provider");
    for (id, creator, amount, status, key) in &payouts {
        let payment = by_key.get(key.as_str());
        match status.as_str() {
            "paid" => {
                let p = payment.unwrap_or_else(|| panic!("payout {id} is paid; the provider has no payment"));
                assert_eq!(
                    (p.status.as_str(), p.amount.as_str(), p.creator.as_str()),
                    ("paid", amount.as_str(), creator.as_str()),
                    "payout {id}"
                );
                assert!(!returned.contains_key(id), "paid payout {id} was returned");
            }
            "failed" => {
                assert!(
                    payment.is_none_or(|p| p.status.as_str() == "failed"),
                    "failed payout {id} was paid at the provider"
                );
                assert_eq!(returned.get(id), Some(amount), "failed payout {id} returned once");
            }
            other => panic!("payout {id} ended {other}"),
        }
    }
    let known: std::collections::HashSet<&str> = payouts.iter().map(|p| p.4.as_str()).collect();
    let orphans = payments
        .iter()
        .filter(|p| !known.contains(p.idempotency_key.as_str()))
        .count();
    let stored: std::collections::HashSet<i64> = payouts.iter().map(|p| p.0).collect();
    let vanished = made.iter().filter(|(_, id)| !stored.contains(id)).count();
    let counters = sim.counters().await;
    println!(
        "{} payouts acknowledged, {} on the new primary, {vanished} acknowledged then lost in the failover, \
         {orphans} provider payments without a payout; simulator: {counters}",
        made.len(),
        payouts.len()
    );
    assert_eq!(made.len(), PAYOUTS);
    assert_eq!(
        counters["conflicts"], 0,
        "no key was sent with two different payouts: {counters}"
    );
    assert!(
        orphans <= vanished,
        "a payment without a payout is one lost in the failover"
    );
    assert_eq!(
        count(&on_new, "SELECT count(*) FROM settlement.payout_conflicts").await,
        0
    );
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}

/// The payouts a deliverer paid while the standby got none of them vanish
/// in the failover, ids and all; the new primary hands the same ids out
/// again. Withdrawals' provider keys come from their requests' idempotency
/// keys, not their ids, so the new payouts never meet the lost payments at
/// the provider: every one is paid. A client retrying a vanished request
/// with its key gets a new payout under the same provider key, which the
/// provider answers with the first payment: paid once.
#[tokio::test(flavor = "multi_thread")]
async fn payouts_lost_after_their_delivery_in_an_asynchronous_failover_block_nothing_and_their_retries_pay_once() {
    const SECRET: &str = "whsec-lost";
    let mut pair = start_pair(false);
    let url = multi_host_url(&pair);
    settle_then_cut_replication(&pair, &url).await;
    let sim = ProviderSim::start(&[]);
    let server = api(&url, &["--provider-webhook-secret", SECRET]).await;
    sim.post_webhooks_to(&server, SECRET).await;
    let mut deliverer = settled(
        &url,
        &[
            "deliver",
            "--provider-url",
            &sim.url,
            "--poll-after-secs",
            "1",
            "--max-poll-ms",
            "200",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let on_primary = pair.primary.as_ref().unwrap().url("settled");
    let creators = creators_on(
        &on_primary,
        "SELECT creator FROM settlement.creator_balance ORDER BY creator",
    )
    .await;
    // More than a sequence's 32 cached values: the new primary is sure to
    // hand out some of these ids again.
    for i in 0..40 {
        let (status, body) = pay(&server.base, &format!("lost-{i}"), &creators[i % 2]).await;
        assert_eq!(status, 201, "{body}");
    }
    wait_for(
        &on_primary,
        "SELECT count(*) = 40 FROM settlement.payouts WHERE status = 'paid'",
        "the payouts paid on the old primary",
    )
    .await;
    fail_over(&mut pair, &server).await;
    let on_new = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(count(&on_new, "SELECT count(*) FROM settlement.payouts").await, 0);
    let mut reused = 0;
    for i in 0..40 {
        let (status, body) = pay(&server.base, &format!("after-{i}"), &creators[2 + i % 2]).await;
        assert_eq!(status, 201, "{body}");
        reused += i64::from(body["id"].as_i64().unwrap() <= 40);
    }
    assert!(reused > 0, "the new primary handed out none of the lost ids again");
    // Ten clients retry their vanished requests.
    for i in 0..10 {
        let (status, body) = pay(&server.base, &format!("lost-{i}"), &creators[i % 2]).await;
        assert_eq!(status, 201, "{body}");
    }
    wait_for(
        &on_new,
        "SELECT count(*) = 50 FROM settlement.payouts WHERE status = 'paid'",
        "every payout on the new primary paid",
    )
    .await;
    kill(Pid::from_raw(deliverer.id() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::task::block_in_place(|| wait_bounded(&mut deliverer, 60));
    assert!(status.success(), "deliver exited {status:?}");
    let counters = sim.counters().await;
    assert_eq!(counters["conflicts"], 0, "{counters}");
    assert_eq!(counters["applied"], 80, "40 lost, 40 after: {counters}");
    assert!(counters["replayed"].as_u64().unwrap() >= 10, "{counters}");
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let payments = provider.list_all().await.unwrap();
    let mut conn = PgConnection::connect(&on_new).await.unwrap();
    let keys: Vec<String> = sqlx::query_scalar("SELECT provider_key FROM settlement.payouts")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let orphans = payments.iter().filter(|p| !keys.contains(&p.idempotency_key)).count();
    assert_eq!(
        orphans, 30,
        "the lost payouts nobody retried are paid at the provider only"
    );
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}
