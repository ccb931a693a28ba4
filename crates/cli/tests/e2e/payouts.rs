//! The payout lifecycle on the API side, with real servers: the outbox
//! (debit, payout row and delivery job in one transaction), confirmation
//! tokens raced on two servers, cancel and expiry returning funds once, the
//! database refusing any transition the state machine does not allow, each
//! of the provider's words moving a payout as the word table says, and a
//! bad stored value named by its column.

use crate::common;

use common::{Env, PERIOD};
use serde_json::{json, Value};
use settled::payouts::word::REFUSAL;
use settled::payouts::{PayoutRow, PayoutState, ProviderWord, Source};

const TOKEN: &str = "test-token";

/// A period settled for `n` creators; returns the richest creator and its balance.
async fn settled_env(n: &str) -> (Env, String, String) {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", n]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let (creator, balance): (String, String) =
        sqlx::query_as("SELECT creator, balance::text FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    (env, creator, balance)
}

async fn post(url: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
    let response = common::post_json(&reqwest::Client::new(), url, TOKEN, key, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn balance(env: &Env, creator: &str) -> String {
    env.scalar_text(&format!(
        "SELECT balance::text FROM settlement.creator_balance WHERE creator = '{creator}'"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payout_commits_its_debit_row_and_delivery_job_together_with_its_history() {
    let (env, creator, before) = settled_env("20").await;
    let server = env.serve(TOKEN).await;
    let (status, payout) = post(
        &format!("{}/v1/payouts", server.base),
        Some("outbox-1"),
        &json!({ "creator": creator, "amount": "1000" }),
    )
    .await;
    assert_eq!(status, 201, "{payout}");
    assert_eq!(payout["status"], "queued");
    let id = payout["id"].as_i64().unwrap();
    assert_eq!(
        env.scalar_i64(&format!(
            "SELECT count(*) FROM settlement.payout_jobs WHERE payout_id = {id}"
        ))
        .await,
        1,
        "the delivery job committed with the payout"
    );
    let expected = env
        .scalar_text(&format!("SELECT ({before}::numeric - 1000)::text"))
        .await;
    assert_eq!(balance(&env, &creator).await, expected);
    // A refused payout writes nothing: no row, no job, no debit.
    let (status, _) = post(
        &format!("{}/v1/payouts", server.base),
        Some("outbox-2"),
        &json!({ "creator": creator, "amount": before }),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payout_jobs").await, 1);
    let shown: Value =
        common::json_of(common::client_with(TOKEN).get(format!("{}/v1/payouts/{id}", server.base))).await;
    assert_eq!(shown["history"][0]["to_state"], "queued", "{shown}");
    assert!(shown["history"][0]["from_state"].is_null(), "{shown}");
    env.run_ok(&["verify", "--period", PERIOD]);
}

#[tokio::test(flavor = "multi_thread")]
async fn racing_confirmations_on_two_servers_give_one_success() {
    let (env, creator, _) = settled_env("20").await;
    let (a, b) = (env.serve(TOKEN).await, env.serve(TOKEN).await);
    let (status, payout) = post(
        &format!("{}/v1/payouts", a.base),
        Some("confirm-1"),
        &json!({ "creator": creator, "amount": "777", "confirm": true }),
    )
    .await;
    assert_eq!(status, 201, "{payout}");
    assert_eq!(payout["status"], "created");
    let (id, token) = (
        payout["id"].as_i64().unwrap(),
        payout["confirm_token"].as_str().unwrap().to_string(),
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_jobs").await,
        0,
        "nothing is delivered before the confirmation"
    );
    let mut racing = tokio::task::JoinSet::new();
    for i in 0..40 {
        let url = format!("{}/v1/payouts/{id}/confirm", if i % 2 == 0 { &a.base } else { &b.base });
        let token = token.clone();
        racing.spawn(async move { post(&url, None, &json!({ "token": token })).await });
    }
    let mut answers = Vec::new();
    while let Some(answer) = racing.join_next().await {
        answers.push(answer.unwrap());
    }
    let ok: Vec<&(u16, Value)> = answers.iter().filter(|(s, _)| *s == 200).collect();
    assert_eq!(ok.len(), 1, "exactly one confirmation succeeds: {answers:?}");
    assert_eq!(ok[0].1["status"], "queued");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert!(
            *status == 409 && body["type"] == "/problems/payout-not-awaiting-confirmation"
                || *status == 403 && body["type"] == "/problems/token-refused",
            "{status} {body}"
        );
    }
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payout_jobs").await, 1);
    assert_eq!(
        env.scalar_i64(&format!(
            "SELECT count(*) FROM settlement.payout_history WHERE payout_id = {id} AND to_state = 'queued'"
        ))
        .await,
        1
    );
    // A wrong token confirms nothing, even for a payout still awaiting one.
    let (_, other) = post(
        &format!("{}/v1/payouts", a.base),
        Some("confirm-2"),
        &json!({ "creator": creator, "amount": "5", "confirm": true }),
    )
    .await;
    let other_id = other["id"].as_i64().unwrap();
    let (status, body) = post(
        &format!("{}/v1/payouts/{other_id}/confirm", a.base),
        None,
        &json!({ "token": token }),
    )
    .await;
    assert_eq!(
        (status, body["type"].as_str()),
        (403, Some("/problems/token-refused")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unconfirmed_payout_expires_or_is_cancelled_and_its_funds_come_back_once() {
    let (env, creator, before) = settled_env("20").await;
    let server = env.serve(TOKEN).await;
    let make = |key: &'static str| {
        let (url, creator) = (format!("{}/v1/payouts", server.base), creator.clone());
        async move {
            post(
                &url,
                Some(key),
                &json!({ "creator": creator, "amount": "300", "confirm": true }),
            )
            .await
        }
    };
    let (_, first) = make("expire-1").await;
    let (_, second) = make("cancel-1").await;
    let (first, second) = (first["id"].as_i64().unwrap(), second["id"].as_i64().unwrap());
    // Its window passes (made so in SQL), and the expiry runs twice.
    sqlx::query("UPDATE settlement.payouts SET expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(first)
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        env.scalar_i64("SELECT settlement.expire_unconfirmed_payouts(100)")
            .await,
        1
    );
    assert_eq!(
        env.scalar_i64("SELECT settlement.expire_unconfirmed_payouts(100)")
            .await,
        0
    );
    let (status, body) = post(&format!("{}/v1/payouts/{second}/cancel", server.base), None, &json!({})).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("cancelled")), "{body}");
    let (status, body) = post(&format!("{}/v1/payouts/{second}/cancel", server.base), None, &json!({})).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (409, Some("/problems/payout-not-cancellable")),
        "{body}"
    );
    assert_eq!(balance(&env, &creator).await, before, "both amounts came back, once");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_returns").await,
        2
    );
    env.run_ok(&["verify", "--period", PERIOD]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_database_refuses_every_change_the_state_machine_does_not_allow() {
    let (env, creator, _) = settled_env("20").await;
    let server = env.serve(TOKEN).await;
    let (_, payout) = post(
        &format!("{}/v1/payouts", server.base),
        Some("rules-1"),
        &json!({ "creator": creator, "amount": "10" }),
    )
    .await;
    let id = payout["id"].as_i64().unwrap();
    let refused = |sql: String| {
        let pool = env.pool.clone();
        async move {
            let err = sqlx::query(&sql).execute(&pool).await.expect_err(&sql);
            err.as_database_error().unwrap().message().to_string()
        }
    };
    // Queued cannot jump back, nor be cancelled; what it pays never changes.
    for (sql, says) in [
        (
            format!("UPDATE settlement.payouts SET status = 'created' WHERE id = {id}"),
            "cannot go from queued to created",
        ),
        (
            format!("UPDATE settlement.payouts SET status = 'cancelled' WHERE id = {id}"),
            "cannot go from queued to cancelled",
        ),
        (
            format!("UPDATE settlement.payouts SET amount = 1 WHERE id = {id}"),
            "never change",
        ),
        (format!("DELETE FROM settlement.payouts WHERE id = {id}"), "append-only"),
        (
            format!("DELETE FROM settlement.payout_history WHERE payout_id = {id}"),
            "append-only",
        ),
    ] {
        let message = refused(sql.clone()).await;
        assert!(message.contains(says), "{sql}: {message}");
    }
    // Paid is final: failed after it is refused, so no funds can come back.
    let moved: bool = sqlx::query_scalar("SELECT settlement.move_payout($1, ARRAY['queued'], 'paid', 'test', 'p-1')")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(moved);
    let message = refused(format!(
        "UPDATE settlement.payouts SET status = 'failed' WHERE id = {id}"
    ))
    .await;
    assert!(message.contains("cannot go from paid to failed"), "{message}");
    let moved: bool =
        sqlx::query_scalar("SELECT settlement.move_payout($1, ARRAY['queued', 'sent'], 'failed', 'test', NULL)")
            .bind(id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(!moved, "a conditional move from the wrong state does nothing");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_returns").await,
        0
    );
    env.run_ok(&["verify", "--period", PERIOD]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hold_refuses_the_confirmation_of_its_creators_payout_and_holds_back_its_delivery_until_released() {
    let (env, creator, _) = settled_env("20").await;
    let server = env.serve(TOKEN).await;
    let (status, payout) = post(
        &format!("{}/v1/payouts", server.base),
        Some("held-1"),
        &json!({ "creator": creator, "amount": "700", "confirm": true }),
    )
    .await;
    assert_eq!((status, payout["status"].as_str()), (201, Some("created")), "{payout}");
    let (id, token) = (
        payout["id"].as_i64().unwrap(),
        payout["confirm_token"].as_str().unwrap().to_string(),
    );
    let hold = |reason: &'static str| {
        let (url, creator) = (format!("{}/v1/holds", server.base), creator.clone());
        async move {
            let (status, hold) = post(&url, None, &json!({ "creator": creator, "reason": reason })).await;
            assert_eq!(status, 201, "{hold}");
            hold["id"].as_i64().unwrap()
        }
    };
    let release = |hold: i64| {
        let url = format!("{}/v1/holds/{hold}/release", server.base);
        async move {
            let (status, body) = post(&url, None, &json!({})).await;
            assert_eq!(status, 200, "{body}");
        }
    };
    let confirm_url = format!("{}/v1/payouts/{id}/confirm", server.base);
    let first = hold("review").await;
    // On hold: the confirmation is refused, the payout still awaits it,
    // nothing is queued for delivery, and the token stays usable.
    let (status, body) = post(&confirm_url, None, &json!({ "token": token })).await;
    assert_eq!(
        (status, body["type"].as_str(), body["hold"].as_i64()),
        (409, Some("/problems/creator-on-hold"), Some(first)),
        "{body}"
    );
    let state = format!("SELECT status FROM settlement.payouts WHERE id = {id}");
    assert_eq!(env.scalar_text(&state).await, "created");
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payout_jobs").await, 0);
    release(first).await;
    let (status, body) = post(&confirm_url, None, &json!({ "token": token })).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("queued")), "{body}");

    // Queued, then a hold: delivery does not send it, and waits.
    let second = hold("second review").await;
    let sim = common::ProviderSim::start(&[]);
    let mut deliverer = env.deliver(&sim.url, &["--provider-timeout-ms", "500"]);
    let job = format!("SELECT coalesce(last_error, '') FROM settlement.payout_jobs WHERE payout_id = {id}");
    common::wait_until(60, "delivery waiting on the hold", || async {
        env.scalar_text(&job).await.contains(&format!("active hold {second}"))
    })
    .await;
    assert_eq!(env.scalar_text(&state).await, "queued");
    let key = env
        .scalar_text(&format!("SELECT provider_key FROM settlement.payouts WHERE id = {id}"))
        .await;
    let provider = settled::provider::HttpProvider::new(&sim.url, std::time::Duration::from_secs(10)).unwrap();
    use settled::provider::PayoutProvider;
    assert!(
        provider.lookup(&key).await.unwrap().is_none(),
        "nothing was sent while the creator was on hold"
    );
    release(second).await;
    common::wait_until(60, "the payout delivered after the release", || async {
        env.scalar_text(&state).await != "queued"
    })
    .await;
    common::stop(&mut deliverer);
    assert!(provider.lookup(&key).await.unwrap().is_some());
    env.run_ok(&["verify", "--payouts"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_confirmation_waits_for_a_hold_being_placed_and_then_sees_it() {
    let (env, creator, _) = settled_env("20").await;
    let server = env.serve(TOKEN).await;
    let (_, payout) = post(
        &format!("{}/v1/payouts", server.base),
        Some("race-1"),
        &json!({ "creator": creator, "amount": "50", "confirm": true }),
    )
    .await;
    let (id, token) = (
        payout["id"].as_i64().unwrap(),
        payout["confirm_token"].as_str().unwrap().to_string(),
    );
    // A hold being placed: its transaction holds the creator's balance row.
    let mut placing = env.pool.begin().await.unwrap();
    sqlx::query("SELECT settlement.place_hold($1, 'placed while a confirmation runs')")
        .bind(&creator)
        .execute(&mut *placing)
        .await
        .unwrap();
    let url = format!("{}/v1/payouts/{id}/confirm", server.base);
    let confirming = tokio::spawn(async move { post(&url, None, &json!({ "token": token })).await });
    common::wait_until(30, "the confirmation waiting on the balance row's lock", || async {
        env.scalar_i64(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE '%confirm_payout%'",
        )
        .await
            == 1
    })
    .await;
    placing.commit().await.unwrap();
    let (status, body) = confirming.await.unwrap();
    assert_eq!(
        (status, body["type"].as_str()),
        (409, Some("/problems/creator-on-hold")),
        "{body}"
    );
    assert_eq!(
        env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
            .await,
        "created"
    );
}

/// Payout `id`'s state.
async fn state_of(env: &Env, id: i64) -> PayoutState {
    let state = env
        .scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
        .await;
    PayoutState::parse(&state).unwrap()
}

/// A payout of 1 to `creator` brought to `state` along allowed moves (a
/// returned one by way of paid).
async fn payout_in(env: &Env, server: &str, creator: &str, state: PayoutState, key: &str) -> i64 {
    use PayoutState as S;
    let confirm = matches!(state, S::Created | S::Cancelled | S::Expired);
    let (status, payout) = post(
        &format!("{server}/v1/payouts"),
        Some(key),
        &json!({ "creator": creator, "amount": "1", "confirm": confirm }),
    )
    .await;
    assert_eq!(status, 201, "{payout}");
    let id = payout["id"].as_i64().unwrap();
    let from = if confirm { "created" } else { "queued" };
    let steps: &[(&str, PayoutState)] = match state {
        S::Created | S::Queued => &[],
        S::Returned => &[(from, S::Paid), ("paid", S::Returned)],
        _ => &[(from, state)],
    };
    for (from, to) in steps {
        let moved: bool = sqlx::query_scalar("SELECT settlement.move_payout($1, ARRAY[$2], $3, 'test', $4)")
            .bind(id) // $1
            .bind(from) // $2
            .bind(to.as_str()) // $3
            .bind((!confirm).then(|| format!("pay-{id}"))) // $4
            .fetch_one(&env.pool)
            .await
            .unwrap();
        assert!(moved, "payout {id} to {to}");
    }
    assert_eq!(state_of(env, id).await, state);
    id
}

/// The table in `payouts/word.rs` (the moves each of the provider's words
/// and a refusal asks for) is what the database's one-purpose functions
/// do, from every state: the move from the payout's state when there is
/// one, nothing otherwise; and it is `settlement.provider_word_moves`, row
/// for row.
#[tokio::test(flavor = "multi_thread")]
async fn each_word_of_the_provider_moves_a_payout_from_every_state_as_the_word_table_says() {
    let (env, creator, _) = settled_env("20").await;
    let server = env.serve(TOKEN).await;
    let words = |id: i64| {
        [
            ProviderWord::Pending {
                provider_id: format!("pay-{id}"),
            },
            ProviderWord::Paid {
                provider_id: format!("pay-{id}"),
            },
            ProviderWord::Failed {
                provider_id: Some(format!("pay-{id}")),
                reason: "account closed".into(),
            },
            ProviderWord::Returned {
                provider_id: format!("pay-{id}"),
                reason: "account closed".into(),
            },
        ]
    };
    let mut in_database: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT provider_status, from_state, to_state FROM settlement.provider_word_moves ORDER BY 1, 2",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut in_rust: Vec<(String, String, String)> = ProviderWord::table()
        .iter()
        .flat_map(|(status, moves)| {
            moves
                .0
                .iter()
                .map(|m| (status.to_string(), m.from.to_string(), m.to.to_string()))
        })
        .collect();
    in_database.sort();
    in_rust.sort();
    assert_eq!(
        in_rust, in_database,
        "payouts/word.rs and settlement.provider_word_moves"
    );
    let mut conn = env.pool.acquire().await.unwrap();
    let mut checked = 0;
    for state in PayoutState::ALL {
        for n in 0..words(0).len() {
            let id = payout_in(&env, &server.base, &creator, state, &format!("word-{state}-{n}")).await;
            let word = &words(id)[n];
            settled::payouts::apply_word(&mut conn, id, word, Source::Poll, None)
                .await
                .unwrap();
            let expected = word.moves().from(state).unwrap_or(state);
            assert_eq!(state_of(&env, id).await, expected, "{word:?} of a {state} payout");
            checked += 1;
        }
        let id = payout_in(&env, &server.base, &creator, state, &format!("refused-{state}")).await;
        settled::payouts::fail_refused(&mut conn, id, "refused by the provider: 400")
            .await
            .unwrap();
        let expected = REFUSAL.from(state).unwrap_or(state);
        assert_eq!(state_of(&env, id).await, expected, "a refusal of a {state} payout");
        checked += 1;
    }
    assert_eq!(checked, 40);
    env.run_ok(&["verify", "--payouts"]);
}

/// A payout read through the one row type: a stored value that is not
/// what its column holds is an error naming the payout and the column.
#[tokio::test(flavor = "multi_thread")]
async fn a_payout_row_with_a_bad_stored_value_is_an_error_naming_its_column() {
    let env = Env::new().await;
    let row = |status: &str, amount: &str| {
        format!(
            "SELECT 12::bigint AS id, 'withdrawal' AS kind, '0x00000000000000000000000000000000000000aa' AS creator,
                    '{amount}' AS amount, '{status}' AS status, 'withdrawal-k' AS provider_key,
                    'withdrawal-k' AS reference, 'k' AS idempotency_key, NULL::text AS provider_id"
        )
    };
    let good: PayoutRow = sqlx::query_as(&row("sent", "10")).fetch_one(&env.pool).await.unwrap();
    assert_eq!(
        (good.id, good.state, good.amount.to_string()),
        (12, PayoutState::Sent, "10".into())
    );
    for (sql, says) in [
        (row("in_transit", "10"), "column \"status\""),
        (row("sent", "1.5"), "column \"amount\""),
    ] {
        let err = sqlx::query_as::<_, PayoutRow>(&sql)
            .fetch_one(&env.pool)
            .await
            .expect_err(&sql)
            .to_string();
        assert!(err.contains(says) && err.contains("payout 12's"), "{err}");
    }
}
