//! Returns: a paid payout returned, a payout returned twice, a return that gives the money back twice.

use super::*;

/// The replay's setup, its key lock a minute: with `guarded` the real
/// database, else one without `guards`.
async fn setup_unless(guarded: bool, guards: &[&str]) -> Setup {
    let unguard: &[&str] = if guarded { &[] } else { guards };
    setup(unguard, Duration::from_secs(60)).await
}

/// The first steps of both traces of a confirmed payout its creator
/// cancels: made, confirmed, the cancel's read, and w0's call, accepted.
const CANCELLED_WHILE_CALLED: [&str; 7] = [
    "POST /v1/payouts (key k0)",
    "pay() k0",
    "POST /v1/payouts/0/confirm",
    "POST /v1/payouts/0/cancel",
    "Confirm writes payout 0 Queued",
    "w0 claim_leased",
    "w0 work: provider pay(key) answers Accepted",
];

/// What became of payout `id`; then w0 let go and its worker stopped.
async fn ended_and_stopped(s: &Setup, id: i64, w0: Script<ClaimedJob>, worker: DeliveryWorker) -> Ended {
    let outcome = ended(s, id).await;
    w0.go();
    stop(worker).await;
    outcome
}

/// A delivery worker as [`delivery_worker`] starts it.
type DeliveryWorker = (tokio::task::JoinHandle<()>, Arc<ServeStats>);

/// Steps 1-8 of a confirmed payout's traces: created under `key` (the
/// reads, 3-4, see `created`), confirmed (5), claimed and called by w0
/// (6-7; w0 stops once the provider answered), and settled by the
/// provider as `settled_as` (8). The payout, w0's script and worker, and
/// the payment.
async fn confirmed_and_settled(
    s: &Setup,
    key: &str,
    settled_as: &str,
) -> (i64, Script<ClaimedJob>, DeliveryWorker, Payment) {
    let a = &s.servers[0];
    let (id, token) = created_payout(a, key).await;
    assert_eq!(status_of(&s.pool, id).await, "created");
    let (status, body) = post(a, &format!("/v1/payouts/{id}/confirm"), None, json!({ "token": token })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (handler, mut w0) = scripted(deliver(&s.pool, &s.sim), &[Point::Called]);
    let worker = delivery_worker(&s.pool, handler);
    w0.reached(Point::Called).await;
    let payment = settled_payment(&s.sim, &provider_key(&s.pool, id).await).await;
    assert_eq!(payment.status.as_str(), settled_as);
    (id, w0, worker, payment)
}

/// The model's trace without the conditional update and the transitions
/// table (`settled-models --counterexamples`), step by step:
///
/// 1-2. `POST /v1/payouts` with `"confirm": true`: the payout `created`.
/// 3. the confirmation reads `created` (its write is step 5).
/// 4. the creator's cancel reads `created`, and decides to cancel.
/// 5. the confirmation writes `queued` (the real `POST ../confirm`: with
///    the payout still `created`, its conditional write and a blind one
///    write the same), the delivery job with it.
/// 6-7. w0 claims the job and calls the provider: accepted (w0 stops there).
/// 8. the provider pays the payment.
/// 9. its webhook's transaction reads `queued`.
/// 10. the cancel writes `cancelled` blind: the trigger returns the funds.
///
/// With the real code, each read is its write: the webhook moves the
/// payout to `paid` at step 9, and the cancel (`move_payout(id, [created],
/// cancelled)`) at step 10 moves nothing.
async fn paid_then_returned(guarded: bool) -> Ended {
    let s = setup_unless(guarded, &[NO_TRANSITIONS_TABLE]).await;
    let [a, b] = &s.servers;
    // 1-8; the provider pays it (the simulator settles at once).
    let (id, w0, worker, paid) = confirmed_and_settled(&s, "paid-then-returned", "paid").await;
    // 9. Its webhook.
    if guarded {
        let (status, body) = post_event(b, &event_of(&paid)).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (StatusCode::OK, Some("applied")),
            "{body}"
        );
    } else {
        assert_eq!(status_of(&s.pool, id).await, "queued", "the webhook reads queued");
    }
    // 10. The cancel's write.
    if guarded {
        let (status, body) = post(a, &format!("/v1/payouts/{id}/cancel"), None, json!({})).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
    } else {
        write_blind(&s.pool, id, "cancelled", "cancelled by request").await;
    }
    ended_and_stopped(&s, id, w0, worker).await
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_conditional_update_and_the_transitions_table_a_paid_payout_is_returned() {
    let steps = [
        "provider: payment 0 paid",
        "POST /v1/provider-events (e0)",
        "Creator writes payout 0 Cancelled (blind)",
    ];
    model_trace(
        suite::without_state_condition_and_transitions(),
        &[&CANCELLED_WHILE_CALLED[..], &steps[..]].concat(),
    );
    let unguarded = paid_then_returned(false).await;
    assert_eq!(
        unguarded,
        Ended::of("cancelled", 1, BALANCE, &["paid"]),
        "the provider paid the creator, and the funds came back too"
    );
    let real = paid_then_returned(true).await;
    assert_eq!(real, Ended::of("paid", 0, BALANCE - AMOUNT, &["paid"]));
}

/// The model's trace without the conditional update, the transitions
/// table and the return's key:
///
/// 1-5. as above: created, the confirmation's read, the cancel's read
///    (`created`), the confirmation's write (`queued`, the job).
/// 6-7. w0 claims and calls: accepted (w0 stops there).
/// 8. the provider fails the payment.
/// 9. its webhook (`payment.failed`) reads `queued` and decides `failed`.
/// 10. the cancel writes `cancelled` blind: funds returned.
/// 11. the webhook writes `failed` blind: funds returned again.
///
/// With the real code the webhook moves the payout to `failed` (funds
/// returned) at step 9 and the cancel moves nothing at step 10.
async fn returned_twice(guarded: bool) -> Ended {
    let s = setup_unless(guarded, &[NO_TRANSITIONS_TABLE, NO_RETURN_KEY]).await;
    set_faults(&s.sim, json!({ "failure_rate": 1.0 })).await;
    let [a, b] = &s.servers;
    // 1-8; the provider fails it.
    let (id, w0, worker, failed) = confirmed_and_settled(&s, "returned-twice", "failed").await;
    let event = event_of(&failed);
    if guarded {
        // 9. The webhook, read and written at once.
        let (status, body) = post_event(b, &event).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (StatusCode::OK, Some("applied")),
            "{body}"
        );
        // 10. The cancel.
        let (status, body) = post(a, &format!("/v1/payouts/{id}/cancel"), None, json!({})).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
    } else {
        // 9. The webhook's transaction reads queued: it will write failed.
        let mut webhook = s.pool.begin().await.unwrap();
        let read: String = sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *webhook)
            .await
            .unwrap();
        assert_eq!(read, "queued");
        // 10. The cancel's blind write.
        write_blind(&s.pool, id, "cancelled", "cancelled by request").await;
        // 11. The webhook's blind write, and its event.
        write_event_blind(&mut webhook, id, "failed", &event).await;
        webhook.commit().await.unwrap();
    }
    ended_and_stopped(&s, id, w0, worker).await
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_state_guards_a_payout_is_returned_twice() {
    let steps = [
        "provider: payment 0 failed",
        "POST /v1/provider-events (e0)",
        "Creator writes payout 0 Cancelled (blind)",
        "Webhook(0) writes payout 0 Failed (blind)",
    ];
    model_trace(
        suite::without_state_guards(),
        &[&CANCELLED_WHILE_CALLED[..], &steps[..]].concat(),
    );
    let unguarded = returned_twice(false).await;
    assert_eq!(
        unguarded,
        Ended::of("failed", 2, BALANCE + AMOUNT, &["failed"]),
        "returned twice: the balance is more than it was before the payout"
    );
    let real = returned_twice(true).await;
    assert_eq!(real, Ended::of("failed", 1, BALANCE, &["failed"]));
}

/// The model's trace without the return's guards (the conditional update,
/// the transitions table, the return's key), step by step:
///
/// 1-2. `POST /v1/payouts`: queued, its job.
/// 3-4. w0 claims the job and calls the provider: accepted (w0 stops there).
/// 5. the provider pays the payment, and sends `payment.paid` (e0).
/// 6. its bank returns it: `payment.returned` (e0r).
/// 7. e0's transaction reads `queued`, and decides paid.
/// 8. e0r's transaction reads `queued`, and decides returned.
/// 9. e0r writes `returned` blind: the trigger returns the funds.
/// 10. e0 writes `paid` blind, over the return.
/// 11-12. the look-up of paid payouts reads `paid`, the provider says
///    returned: it writes `returned` blind, and the funds come back again.
///
/// With the real code each read is its write (`apply_provider_word`, one
/// conditional update along `provider_word_moves`): e0 moves the payout
/// paid at step 7, e0r returned at step 8 (funds back once), and the
/// look-up finds nothing to do.
async fn returned_before_paid(guarded: bool) -> Ended {
    let s = setup_unless(guarded, &[NO_TRANSITIONS_TABLE, NO_RETURN_KEY]).await;
    // 1-2. The payout.
    let (status, made) = post_payout(&s.servers[0], "returned-before-paid", false).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_i64().unwrap();
    // 3-4. w0 claims and calls; the provider accepts it.
    let (handler, mut w0) = scripted(deliver(&s.pool, &s.sim), &[Point::Called]);
    let worker = delivery_worker(&s.pool, handler);
    w0.reached(Point::Called).await;
    // 5. The provider pays it (the simulator settles at once).
    let paid = settled_payment(&s.sim, &provider_key(&s.pool, id).await).await;
    assert_eq!(paid.status.as_str(), "paid");
    // 6. Its bank returns it.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payments/{}/return", s.sim, paid.id))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let returned: Payment = r.json().await.unwrap();
    assert_eq!(returned.status.as_str(), "returned");
    let (e0, e0r) = (event_of(&paid), event_of(&returned));
    if guarded {
        // 7-10. Each event read and written at once.
        for (event, outcome) in [(&e0, "applied"), (&e0r, "applied")] {
            let (status, body) = post_event(&s.servers[1], event).await;
            assert_eq!(
                (status, body["outcome"].as_str()),
                (StatusCode::OK, Some(outcome)),
                "{body}"
            );
        }
        // 11-12. The look-up of paid payouts: nothing is paid any more.
        let polling = Polling {
            sent_after: Duration::ZERO,
            paid_every: Duration::ZERO,
            returns_watch: Duration::from_secs(3600),
            key_window: Duration::from_secs(3600),
        };
        let rail = HttpProvider::new(&s.sim, Duration::from_secs(5)).unwrap();
        let looked_up = poll(&s.pool, &rail, &polling, 10).await.unwrap();
        assert_eq!(looked_up, 0, "a returned payout is looked up no more");
    } else {
        // 7-8. Both events' transactions read queued.
        let (mut paid_tx, mut returned_tx) = (s.pool.begin().await.unwrap(), s.pool.begin().await.unwrap());
        for tx in [&mut paid_tx, &mut returned_tx] {
            let read: String = sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
                .bind(id)
                .fetch_one(&mut **tx)
                .await
                .unwrap();
            assert_eq!(read, "queued");
        }
        // 9. e0r's blind write, and its event: funds returned.
        write_event_blind(&mut returned_tx, id, "returned", &e0r).await;
        returned_tx.commit().await.unwrap();
        // 10. e0's blind write over it.
        write_event_blind(&mut paid_tx, id, "paid", &e0).await;
        paid_tx.commit().await.unwrap();
        // 11-12. The look-up reads paid; the provider says returned.
        assert_eq!(status_of(&s.pool, id).await, "paid");
        write_blind(&s.pool, id, "returned", "returned: returned_by_bank (poll)").await;
    }
    ended_and_stopped(&s, id, w0, worker).await
}

/// A webhook's blind write of `to`, and its event stored, on `tx`.
async fn write_event_blind(tx: &mut sqlx::PgConnection, id: i64, to: &str, event: &WebhookEvent) {
    sqlx::query("UPDATE settlement.payouts SET status = $2, reason = $3 WHERE id = $1")
        .bind(id)
        .bind(to)
        .bind(format!("{to} (event {})", event.id))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO settlement.provider_events (id, type, created, provider_key, payout_id, outcome, body)
         VALUES ($1, $2, $3, $4, $5, 'applied', $6) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&event.id)
    .bind(event.r#type.as_str())
    .bind(event.created)
    .bind(&event.data.idempotency_key)
    .bind(id)
    .bind(serde_json::to_value(event).unwrap())
    .execute(&mut *tx)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_returns_guards_a_return_gives_the_money_back_twice() {
    model_trace(
        suite::without_return_guards(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "w0 claim_leased",
            "w0 work: provider pay(key) answers Accepted",
            "provider: payment 0 paid, webhook e0 sent",
            "provider: payment 0 returned, webhook e0r sent",
            "POST /v1/provider-events (e0)",
            "POST /v1/provider-events (e0r)",
            "Webhook(1) writes payout 0 Returned (blind)",
            "Webhook(0) writes payout 0 Paid (blind)",
            "poll looks up payout 0",
            "Poll writes payout 0 Returned (blind)",
        ],
    );
    let unguarded = returned_before_paid(false).await;
    assert_eq!(
        unguarded,
        Ended::of("returned", 2, BALANCE + AMOUNT, &["returned"]),
        "the provider took the payment back once, and the balance got it twice"
    );
    let real = returned_before_paid(true).await;
    assert_eq!(real, Ended::of("returned", 1, BALANCE, &["returned"]));
}
