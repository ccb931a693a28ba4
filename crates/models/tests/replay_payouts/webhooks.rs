//! Confirmations and webhooks: two confirmations both redeeming, a duplicated webhook recorded twice.

use super::*;

/// The model's trace without the token's condition and the conditional
/// update: two confirmations read `created` (3, 4), then each writes
/// (5, 6): both commit, the token redeemed twice. Returns how many
/// confirmations succeeded.
async fn confirmed_twice(guarded: bool) -> usize {
    let s = setup(&[], Duration::from_secs(60)).await;
    let [a, b] = &s.servers;
    let (id, token) = created_payout(a, "confirmed-twice").await;
    if guarded {
        // Both requests inside their transactions at once: held behind the
        // test's lock on the token until both wait.
        let mut hold = s.pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM settled_engine.once_tokens WHERE id = $1::uuid FOR UPDATE")
            .bind(&token)
            .execute(&mut *hold)
            .await
            .unwrap();
        let confirm = |base: String| {
            let token = token.clone();
            tokio::spawn(async move {
                post(
                    &base,
                    &format!("/v1/payouts/{id}/confirm"),
                    None,
                    json!({ "token": token }),
                )
                .await
            })
        };
        let (first, second) = (confirm(a.clone()), confirm(b.clone()));
        lock_waiters(&s.pool, 2).await;
        hold.rollback().await.unwrap();
        let answers = [first.await.unwrap(), second.await.unwrap()];
        return answers.iter().filter(|(status, _)| *status == StatusCode::OK).count();
    }
    // 3-4. Both read created.
    let mut confirmations = Vec::new();
    for _ in 0..2 {
        let mut tx = s.pool.begin().await.unwrap();
        let read: String = sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(read, "created");
        confirmations.push(tx);
    }
    // 5-6. Each redeems the token (its expiry checked, not its status) and
    // writes queued blind, with the job.
    let mut succeeded = 0;
    for mut tx in confirmations {
        let redeemed = sqlx::query(
            "UPDATE settled_engine.once_tokens SET status = 'completed', completed_at = now()
             WHERE id = $1::uuid AND purpose = $2 AND expires_at > now()",
        )
        .bind(&token)
        .bind(settled::payouts::CONFIRMATION_PURPOSE)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
        let moved = sqlx::query("UPDATE settlement.payouts SET status = 'queued', reason = 'confirmed' WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected();
        sqlx::query("INSERT INTO settlement.payout_jobs (payout_id) VALUES ($1) ON CONFLICT (payout_id) DO NOTHING")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        succeeded += usize::from(redeemed == 1 && moved == 1);
    }
    succeeded
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_token_and_state_conditions_two_confirmations_both_redeem() {
    model_trace(
        suite::without_token_conditions(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "POST /v1/payouts/0/confirm",
            "POST /v1/payouts/0/confirm",
            "Confirm writes payout 0 Queued (blind)",
            "Confirm writes payout 0 Queued (blind)",
        ],
    );
    assert_eq!(confirmed_twice(false).await, 2, "one token, two confirmations");
    assert_eq!(confirmed_twice(true).await, 1);
}

/// What the event replay left: the event's rows, and the payout.
#[derive(Debug, PartialEq)]
struct Recorded {
    events: Vec<String>,
    state: String,
    returns: i64,
    balance: i64,
}

/// The webhook's transaction with the unique event id left out: the real
/// `apply_word`, then the event stored without `ON CONFLICT`.
async fn record_without_event_id(pool: PgPool, event: WebhookEvent) {
    let mut tx = pool.begin().await.unwrap();
    let id = settled::payouts::by_provider_key(&mut tx, &event.data.idempotency_key)
        .await
        .unwrap()
        .expect("the payout");
    let applied = settled::payouts::apply_word(
        &mut tx,
        id,
        &word_of(&event.data),
        settled::payouts::Source::Webhook,
        Some(&event.id),
    )
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO settlement.provider_events (id, type, created, provider_key, payout_id, outcome, body)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&event.id)
    .bind(event.r#type.as_str())
    .bind(event.created)
    .bind(&event.data.idempotency_key)
    .bind(id)
    .bind(applied.as_str())
    .bind(serde_json::to_value(&event).unwrap())
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// The model's trace without the unique event id:
///
/// 1-2. `POST /v1/payouts`: the payout `queued`, its job.
/// 3-5. w0 claims, the provider accepts, w0 records `sent`.
/// 6. the provider fails the payment and sends `payment.failed`.
/// 7. the network duplicates it.
/// 8-9. both deliveries are received, on two servers at once: both
///    transactions wait behind the test's lock on the payout, then run
///    one after the other, as the model's two steps.
async fn duplicated_webhook(guarded: bool) -> Recorded {
    let unguard: &[&str] = if guarded {
        &[]
    } else {
        &["ALTER TABLE settlement.provider_events DROP CONSTRAINT provider_events_pkey"]
    };
    let s = setup(unguard, Duration::from_secs(60)).await;
    set_faults(&s.sim, json!({ "failure_rate": 1.0 })).await;
    let (status, made) = post_payout(&s.servers[0], "duplicated-webhook", false).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_i64().unwrap();
    // 3-5. Delivered: sent.
    let worker = delivery_worker(&s.pool, Arc::new(deliver(&s.pool, &s.sim)));
    // 6. The provider fails it.
    let failed = settled_payment(&s.sim, &provider_key(&s.pool, id).await).await;
    for _ in 0..500 {
        if status_of(&s.pool, id).await == "sent" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status_of(&s.pool, id).await, "sent");
    stop(worker).await;
    // 7-9. The event twice, at once.
    let event = event_of(&failed);
    let mut hold = s.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settlement.payouts WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *hold)
        .await
        .unwrap();
    let deliveries: Vec<_> = s
        .servers
        .iter()
        .map(|base| {
            let (base, event, pool) = (base.clone(), event.clone(), s.pool.clone());
            tokio::spawn(async move {
                if guarded {
                    let (status, body) = post_event(&base, &event).await;
                    assert_eq!(status, StatusCode::OK, "{body}");
                } else {
                    record_without_event_id(pool, event).await;
                }
            })
        })
        .collect();
    lock_waiters(&s.pool, 2).await;
    hold.rollback().await.unwrap();
    for delivery in deliveries {
        delivery.await.unwrap();
    }
    let events: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM settlement.provider_events WHERE id = $1 ORDER BY outcome")
            .bind(&event.id)
            .fetch_all(&s.pool)
            .await
            .unwrap();
    let (state, returns, balance) = payout(&s.pool, id).await;
    Recorded {
        events,
        state,
        returns,
        balance,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_unique_event_id_a_duplicated_webhook_is_recorded_twice() {
    model_trace(
        suite::without_event_id(),
        &[
            "POST /v1/payouts (key k0)",
            "pay() k0",
            "w0 claim_leased",
            "w0 work: provider pay(key) answers Accepted",
            "w0 complete_fenced + Deliver::complete",
            "provider: payment 0 failed",
            "network duplicates webhook e0",
            "POST /v1/provider-events (e0)",
            "POST /v1/provider-events (e0)",
        ],
    );
    let unguarded = duplicated_webhook(false).await;
    assert_eq!(
        unguarded,
        Recorded {
            events: vec!["already".into(), "applied".into()],
            state: "failed".into(),
            returns: 1,
            balance: BALANCE,
        },
        "the event is recorded twice; the conditional update still returns the funds once"
    );
    let real = duplicated_webhook(true).await;
    assert_eq!(
        real,
        Recorded {
            events: vec!["applied".into()],
            state: "failed".into(),
            returns: 1,
            balance: BALANCE,
        }
    );
}
