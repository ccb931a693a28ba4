//! Keys: two posts without the request key, a zombie and its rescuer without the provider key.

use super::*;

/// The model's trace without the request's key (its claim and the unique
/// `payouts.idempotency_key`):
///
/// 1-2. `POST /v1/payouts` with key k0, then the same again (the client
///    timed out) through the other server.
/// 3-4. each reads no payout under k0.
/// 5-6. each debits and makes a payout.
///
/// With the real code, the servers hold keys for 1 ms (standing for a first
/// request paused past its `locked_until`), so the second takes the key
/// over; both requests read no payout and queue behind the test's lock on
/// the balance; released, the first debits, makes its payout and stores its
/// answer (201); the second's insert meets the unique key and rolls back
/// (503), and its retry gets the first's payout. Returns (payouts made
/// under the key, the balance).
async fn posted_twice(guarded: bool) -> (i64, i64) {
    let unguard: &[&str] = if guarded {
        &[]
    } else {
        // The provider key is derived from the request key and unique too
        // (migration 20261203000701), so it backs the request key up and
        // goes with it.
        &[
            "ALTER TABLE settlement.payouts DROP CONSTRAINT payouts_idempotency_key_key",
            "DROP INDEX settlement.payouts_provider_key",
        ]
    };
    let s = setup(unguard, Duration::from_millis(1)).await;
    let key = "posted-twice";
    let mut hold = s.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settlement.creator_balance WHERE creator = $1 FOR UPDATE")
        .bind(CREATOR)
        .execute(&mut *hold)
        .await
        .unwrap();
    let request = |i: usize| {
        let (base, pool) = (s.servers[i].clone(), s.pool.clone());
        tokio::spawn(async move {
            if guarded {
                return post_payout(&base, key, false).await;
            }
            // pay() without the key's claim, and with no unique key.
            let earlier: Option<i64> =
                sqlx::query_scalar("SELECT id FROM settlement.payouts WHERE idempotency_key = $1")
                    .bind(key)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
            assert_eq!(earlier, None);
            let mut tx = pool.begin().await.unwrap();
            let outcome: String = sqlx::query_scalar(
                "SELECT outcome FROM settlement.debit_for_payout($1, $2::numeric, $3, $4, NULL, NULL, NULL)",
            )
            .bind(CREATOR)
            .bind(AMOUNT.to_string())
            .bind(key)
            .bind("POST /v1/payouts replay")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            assert_eq!(outcome, "paid");
            (StatusCode::CREATED, Value::Null)
        })
    };
    // The first request reaches the lock, then the second.
    let mut answers = Vec::new();
    for i in 0..2 {
        answers.push(request(i));
        lock_waiters(&s.pool, i as i64 + 1).await;
    }
    hold.rollback().await.unwrap();
    let mut statuses = Vec::new();
    for answer in answers {
        statuses.push(answer.await.unwrap());
    }
    if guarded {
        let got: Vec<(StatusCode, Option<&str>)> = statuses.iter().map(|(s, b)| (*s, b["type"].as_str())).collect();
        // The second failed on the database (its insert), not by waiting
        // on the lock (that would be database-busy).
        assert_eq!(
            got,
            [
                (StatusCode::CREATED, None),
                (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/database-unavailable"))
            ],
            "{statuses:?}"
        );
        let (status, again) = post_payout(&s.servers[1], key, false).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "the retry is answered with the first payout: {again}"
        );
    }
    let made = count(
        &s.pool,
        "SELECT count(*) FROM settlement.payouts WHERE idempotency_key = 'posted-twice'",
    )
    .await;
    let balance = count(&s.pool, "SELECT balance::bigint FROM settlement.creator_balance").await;
    (made, balance)
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_request_key_two_posts_make_two_payouts() {
    model_trace(
        suite::without_request_key(),
        &[
            "POST /v1/payouts (key k0)",
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "pay() k0",
            "debit_for_payout + finish (after reading none)",
            "debit_for_payout + finish (after reading none)",
        ],
    );
    assert_eq!(
        posted_twice(false).await,
        (2, BALANCE - 2 * AMOUNT),
        "one request, two debits"
    );
    assert_eq!(posted_twice(true).await, (1, BALANCE - AMOUNT));
}

/// The model's trace without the payout's provider key:
///
/// 1-2. `POST /v1/payouts`: queued, its job.
/// 3. w0 claims the job and loads the payout.
/// 4. w0 stops (before its call).
/// 5. the database clock passes its lease (made so in SQL).
/// 6. w0 may run again (it calls at step 10).
/// 7. the rescue takes the job back.
/// 8-9. w1 claims it (attempt 2) and calls: accepted.
/// 10. w0 calls.
///
/// Then w0's completion is refused by the fence and w1's records the
/// answer. Returns the payments the provider applied, the zombie's fence
/// rejections and the payout's state.
async fn zombie_and_rescuer<H, F>(handler: F) -> (usize, u64, String)
where
    H: LeasedJobHandler,
    F: Fn(&PgPool, &str) -> H,
{
    let s = setup(&[], Duration::from_secs(60)).await;
    let (status, made) = post_payout(&s.servers[0], "zombie-and-rescuer", false).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_i64().unwrap();
    // 3-4. w0 claims, loads, stops.
    let (zombie, mut w0) = scripted(handler(&s.pool, &s.sim), &[Point::Calling]);
    let w0_worker = delivery_worker(&s.pool, zombie);
    assert_eq!(w0.reached(Point::Calling).await.fence.get(), 1);
    // 5. Its lease passes.
    sqlx::query("UPDATE settlement.payout_jobs SET lease_until = now() - interval '1 second' WHERE payout_id = $1")
        .bind(id)
        .execute(&s.pool)
        .await
        .unwrap();
    // 7. The rescue.
    let policy = RetryPolicy {
        max_attempts: 25,
        backoff_base_ms: 1,
        backoff_cap_ms: 1,
    };
    // w0's serve runs a rescue when it starts; late under load, it may take
    // the rescuer's lock, or this very job, first: either is the rescue.
    let queue = settled::payouts::delivery_queue();
    let mut job = (String::new(), 0);
    for _ in 0..500 {
        settled_engine::continuous::serve::rescue_once(&s.pool, &queue, &policy)
            .await
            .unwrap();
        job = sqlx::query_as("SELECT status, attempt FROM settlement.payout_jobs WHERE payout_id = $1")
            .bind(id)
            .fetch_one(&s.pool)
            .await
            .unwrap();
        if job.0 != "processing" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(job, ("eligible".to_string(), 1), "the rescue gives the job back");
    // 8-9. w1 claims (attempt 2) and calls.
    let (live, mut w1) = scripted(handler(&s.pool, &s.sim), &[Point::Called]);
    let w1_worker = delivery_worker(&s.pool, live);
    assert_eq!(w1.reached(Point::Called).await.fence.get(), 2);
    // 10. w0 calls, then completes: refused by the fence.
    w0.go();
    for _ in 0..500 {
        if w0_worker.1.fence_rejections.load(Ordering::Relaxed) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rejected = stop(w0_worker).await.fence_rejections.load(Ordering::Relaxed);
    // w1 completes.
    w1.go();
    for _ in 0..500 {
        if status_of(&s.pool, id).await != "queued" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop(w1_worker).await;
    (
        payments_to(&s.sim, CREATOR).await.len(),
        rejected,
        status_of(&s.pool, id).await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_provider_key_a_zombie_and_its_rescuer_pay_twice() {
    model_trace(
        suite::without_payout_key(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "w0 claim_leased",
            "w0 SIGSTOP",
            "clock passes job 0's lease_until",
            "w0 SIGCONT",
            "rescue_expired (job 0)",
            "w1 claim_leased",
            "w1 work: provider pay(key) answers Accepted",
            "w0 work: provider pay(key) answers Accepted",
        ],
    );
    let per_attempt = |pool: &PgPool, sim: &str| KeyPerAttempt {
        real: deliver(pool, sim),
        provider: HttpProvider::new(sim, Duration::from_secs(5)).unwrap(),
        pool: pool.clone(),
    };
    let (payments, rejected, state) = zombie_and_rescuer(per_attempt).await;
    assert_eq!(payments, 2, "with a key per attempt the provider pays the payout twice");
    assert_eq!(
        (rejected, state.as_str()),
        (1, "sent"),
        "while settled records one payment"
    );
    let (payments, rejected, state) = zombie_and_rescuer(deliver).await;
    assert_eq!(payments, 1, "the payout's key makes the zombie's call a replay");
    assert_eq!((rejected, state.as_str()), (1, "sent"));
}
