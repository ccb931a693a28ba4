//! Workers follow a crashed primary to the promoted standby, and a claim lost in the failover is fenced.

use super::*;

async fn crash_mid_run_and_promote(synchronous: bool, mode: Mode) {
    let mut pair = start_pair(synchronous);
    create_database(&pair).await;
    let url = multi_host_url(&pair);
    run_ok(&url, &["seed", "--period", PERIOD, "--creators", &CREATORS.to_string()]);
    let sim = (mode == Mode::Leased).then(|| ProviderSim::start(&[]));
    let mut args = common::lab_worker_args("2", "50", "4");
    if let Some(sim) = &sim {
        args.extend_from_slice(LEASED_FAST);
        args.extend(["--provider-url", sim.url.as_str()]);
    }
    let logs = tempfile::tempdir().unwrap();
    let mut workers: Vec<Child> = (0..3)
        .map(|i| {
            let log = std::fs::File::create(logs.path().join(format!("worker-{i}.log"))).unwrap();
            settled(&url, &args).stdout(Stdio::null()).stderr(log).spawn().unwrap()
        })
        .collect();
    // An API server on the same URL: it answers 503 during the failover and
    // recovers by itself.
    let port = free_port();
    let mut serve = settled(&url, &["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env("SETTLED_API_TOKEN", "t")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let api = format!("http://127.0.0.1:{port}");
    // Mid-run: a sixth of the creators paid.
    let on_primary = pair.primary.as_ref().unwrap().url("settled");
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(&on_primary, "SELECT count(*) FROM settlement.reward_ledger").await < CREATORS / 6 {
        assert!(Instant::now() < deadline, "the run did not get going");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let primary = pair.primary.take().unwrap();
    primary.crash().expect("crash the primary");
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.standby.as_ref().unwrap().promote().expect("promote the standby");
    for (i, worker) in workers.iter_mut().enumerate() {
        let status = tokio::task::block_in_place(|| wait_bounded(worker, 180));
        let log = std::fs::read_to_string(logs.path().join(format!("worker-{i}.log"))).unwrap();
        assert!(status.success(), "worker {i} exited {status:?}:\n{log}");
        assert_eq!(
            log.matches("following the primary to another host").count(),
            1,
            "worker {i} says once that it follows the primary:\n{log}"
        );
        // Bounded logs: at most one line per claim loop for the outage.
        assert!(
            log.matches("chunk rolled back").count() <= 2,
            "worker {i} logged the outage once per attempt:\n{log}"
        );
    }
    if std::env::var_os("SETTLED_SHOW_FAILOVER_LOGS").is_some() {
        for i in 0..3 {
            eprintln!(
                "{}",
                std::fs::read_to_string(logs.path().join(format!("worker-{i}.log"))).unwrap()
            );
        }
    }
    let _ = primary.stop();
    // The API server is on the new primary too.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = reqwest::get(format!("{api}/readyz"))
            .await
            .map(|r| r.status().as_u16())
            .ok();
        if ready == Some(200) {
            break;
        }
        assert!(Instant::now() < deadline, "serve did not recover: {ready:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let creator: String = {
        let mut conn = PgConnection::connect(&pair.standby.as_ref().unwrap().url("settled"))
            .await
            .unwrap();
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    let paid = reqwest::Client::new()
        .post(format!("{api}/v1/payouts"))
        .bearer_auth("t")
        .header("Idempotency-Key", "after-failover")
        .json(&serde_json::json!({ "creator": creator, "amount": "1" }))
        .send()
        .await
        .unwrap();
    // Leased settlement paid the rewards out through the provider, so the
    // balances are empty there: the answer is still a decision written on
    // the new primary (its idempotency key stored), not an error.
    let want = if mode == Mode::Leased { 409 } else { 201 };
    assert_eq!(paid.status(), want, "a payout after the failover");
    let _ = serve.kill();
    let _ = serve.wait();
    // On the new primary: the run finished, every creator paid once.
    let on_new = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(
        count(&on_new, "SELECT count(*) FROM settlement.reward_ledger").await,
        CREATORS
    );
    assert_eq!(
        count(&on_new, "SELECT count(DISTINCT creator) FROM settlement.reward_ledger").await,
        CREATORS
    );
    assert_eq!(
        count(
            &on_new,
            "SELECT count(*) FROM settled_engine.runs WHERE state = 'finished'"
        )
        .await,
        1
    );
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
    if let Some(sim) = &sim {
        // Outside the database, one payment per creator: what the old
        // primary lost was paid again under the same idempotency key.
        let counters = sim.counters().await;
        assert_eq!(counters["applied"], CREATORS, "{counters}");
        assert_eq!(counters["conflicts"], 0, "{counters}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_follow_a_failover_to_the_promoted_standby_and_pay_once_with_asynchronous_replication() {
    crash_mid_run_and_promote(false, Mode::InTransaction).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_follow_a_failover_to_the_promoted_standby_and_pay_once_with_synchronous_replication() {
    crash_mid_run_and_promote(true, Mode::InTransaction).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leased_workers_follow_a_failover_and_the_provider_is_paid_once_per_creator_with_asynchronous_replication() {
    crash_mid_run_and_promote(false, Mode::Leased).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leased_workers_follow_a_failover_and_the_provider_is_paid_once_per_creator_with_synchronous_replication() {
    crash_mid_run_and_promote(true, Mode::Leased).await;
}

/// The fence question. With asynchronous replication a failover loses the
/// commits the standby had not received; a leased claim among them comes
/// back on the new primary as a claim with the same attempt number. The
/// fence carries the primary's timeline too, so the zombie holding the lost
/// claim is refused, where the attempt alone would have let it complete in
/// the new claim's name. (Past the fence, the ledger's key and the
/// provider's idempotency key stop a second payment anyway: see the leased
/// failover tests.)
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_lost_in_a_failover_gets_its_attempt_number_again_and_the_timeline_in_the_fence_refuses_its_zombie() {
    let mut pair = start_pair(false);
    create_database(&pair).await;
    run_ok(
        &multi_host_url(&pair),
        &["seed", "--period", PERIOD, "--creators", "20"],
    );
    let (old_url, new_url) = (
        pair.primary.as_ref().unwrap().url("settled"),
        pair.standby.as_ref().unwrap().url("settled"),
    );
    let job = settled::settlement::job();
    let old = sqlx::PgPool::connect(&old_url).await.unwrap();
    let run = job.start_or_join(&old, PERIOD, None).await.unwrap().run;
    // The standby has all of that; then it stops receiving.
    cut_replication(&pair).await;
    // The zombie's claim commits on the primary only.
    let ttl = Duration::from_secs(600);
    let mut conn = old.acquire().await.unwrap();
    let zombie = job
        .queue()
        .claim_leased(&mut conn, PERIOD, 5, run.id, uuid::Uuid::new_v4(), ttl)
        .await
        .unwrap();
    assert_eq!(zombie.len(), 5);
    drop(conn);
    old.close().await;
    pair.primary.take().unwrap().crash().unwrap();
    pair.standby.as_ref().unwrap().promote().unwrap();
    // The new primary never saw that claim: it hands out the same attempt
    // numbers again, on a new timeline.
    let new = sqlx::PgPool::connect(&new_url).await.unwrap();
    let mut conn = new.acquire().await.unwrap();
    let live = job
        .queue()
        .claim_leased(&mut conn, PERIOD, 20, run.id, uuid::Uuid::new_v4(), ttl)
        .await
        .unwrap();
    assert_eq!(live.len(), 20);
    for z in &zombie {
        let l = live
            .iter()
            .find(|l| l.key == z.key)
            .expect("the zombie's item is claimed again");
        assert_eq!(
            l.fence.get(),
            z.fence.get(),
            "the same attempt number, handed out twice"
        );
        assert!(l.fence.epoch() > z.fence.epoch(), "{} vs {}", l.fence, z.fence);
    }
    // By attempt alone the zombie would complete in the live claim's name...
    let keys: Vec<String> = zombie.iter().map(|z| z.key.clone()).collect();
    let attempts: Vec<i32> = zombie.iter().map(|z| z.fence.get()).collect();
    let by_attempt: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement.token_trade_volume t
         JOIN unnest($1::text[], $2::int[]) AS z(creator, attempt) USING (creator)
         WHERE t.period = $3::date AND t.attempt = z.attempt AND t.status = 'processing'",
    )
    .bind(&keys)
    .bind(&attempts)
    .bind(PERIOD)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(by_attempt, 5);
    drop(conn);
    // ...the fence refuses it, and accepts the live claim.
    let mut tx = new.begin().await.unwrap();
    let accepted = job.queue().complete_fenced(&mut tx, PERIOD, &zombie).await.unwrap();
    assert!(accepted.is_empty(), "the zombie completed: {accepted:?}");
    let accepted = job.queue().complete_fenced(&mut tx, PERIOD, &live).await.unwrap();
    assert_eq!(accepted.len(), 20);
    tx.commit().await.unwrap();
}
