//! Holds under concurrency: one active hold, a held creator paid only after release.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn fifty_concurrent_holds_leave_one_active_hold() {
    let (env, creators) = settled_env("10").await;
    let (a, b) = (serve(&env).await, serve(&env).await);
    let creator = creators[0].0.clone();
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let url = format!("{}/v1/holds", if i % 2 == 0 { &a.base } else { &b.base });
        let (client, creator) = (client.clone(), creator.clone());
        tasks.spawn(async move {
            post(
                &client,
                &url,
                None,
                &json!({ "creator": creator, "reason": format!("admin {i}") }),
            )
            .await
        });
    }
    let mut statuses = Vec::new();
    let mut winner = None;
    while let Some(r) = tasks.join_next().await {
        let (status, body, _) = r.unwrap();
        if status == 201 {
            winner = Some(body["id"].as_i64().unwrap());
        } else {
            assert_eq!(body["type"], "/problems/hold-exists", "{body}");
        }
        statuses.push(status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1);
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 49);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.creator_holds WHERE released_at IS NULL")
            .await,
        1
    );
    // Released once; a second release is refused.
    let url = format!("{}/v1/holds/{}/release", a.base, winner.unwrap());
    assert_eq!(post(&client, &url, None, &json!({})).await.0, 200);
    let (status, body, _) = post(&client, &url, None, &json!({})).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (409, Some("/problems/hold-already-released"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_creator_is_not_paid_until_released_then_paid_once() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-27", "--creators", "30"]);
    env.run_ok(&["worker", "--period", "2026-11-27"]);
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "30"]);
    let server = serve(&env).await;
    let creator = env
        .scalar_text(
            "SELECT creator FROM settlement.token_trade_volume WHERE period = '2026-11-28' ORDER BY creator LIMIT 1",
        )
        .await;
    let client = reqwest::Client::new();
    let (status, hold, _) = post(
        &client,
        &format!("{}/v1/holds", server.base),
        None,
        &json!({ "creator": creator, "reason": "review" }),
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let status_sql = format!(
        "SELECT status FROM settlement.token_trade_volume WHERE period = '2026-11-28' AND creator = '{creator}'"
    );
    assert_eq!(env.scalar_text(&status_sql).await, "held");
    assert_eq!(
        env.scalar_text("SELECT state FROM settled_engine.runs WHERE scope = '2026-11-28'")
            .await,
        "finished"
    );
    env.run_ok(&["verify", "--period", "2026-11-28"]);

    let url = format!("{}/v1/holds/{}/release", server.base, hold["id"]);
    assert_eq!(post(&client, &url, None, &json!({})).await.0, 200);
    assert_eq!(
        env.scalar_text("SELECT state FROM settled_engine.runs WHERE scope = '2026-11-28'")
            .await,
        "running"
    );
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    assert_eq!(env.scalar_text(&status_sql).await, "settled");
    let rows = env
        .scalar_i64(&format!(
            "SELECT count(*) FROM settlement.reward_ledger WHERE creator = '{creator}' AND period = '2026-11-28'"
        ))
        .await;
    assert_eq!(rows, 1);
    env.run_ok(&["verify", "--period", "2026-11-28"]);
}

/// A hold that was acknowledged stops every payout of its creator that
/// comes after it, however many race; its release lets them through again.
#[tokio::test(flavor = "multi_thread")]
async fn an_active_hold_refuses_payouts_of_its_creator_until_released() {
    let (env, creators) = settled_env("10").await;
    let (a, b) = (serve(&env).await, serve(&env).await);
    let (creator, balance_before) = creators[0].clone();
    let client = reqwest::Client::new();
    let hold_body = json!({ "creator": creator, "reason": "fraud check" });
    let (status, hold, _) = post(&client, &format!("{}/v1/holds", a.base), None, &hold_body).await;
    assert_eq!(status, 201, "{hold}");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let url = format!("{}/v1/payouts", if i % 2 == 0 { &a.base } else { &b.base });
        let (client, creator) = (client.clone(), creator.clone());
        tasks.spawn(async move {
            let body = json!({ "creator": creator, "amount": "1" });
            post(&client, &url, Some(&format!("held-{i}")), &body).await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (status, body, _) = joined.unwrap();
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["type"], "/problems/creator-on-hold", "{body}");
        assert_eq!(body["hold"], hold["id"], "{body}");
    }
    let paid_sql = format!("SELECT count(*) FROM settlement.payouts WHERE creator = '{creator}'");
    assert_eq!(env.scalar_i64(&paid_sql).await, 0);
    let balance_sql = format!("SELECT balance::text FROM settlement.creator_balance WHERE creator = '{creator}'");
    assert_eq!(env.scalar_text(&balance_sql).await, balance_before);

    let release = format!("{}/v1/holds/{}/release", b.base, hold["id"]);
    assert_eq!(post(&client, &release, None, &json!({})).await.0, 200);
    let url = format!("{}/v1/payouts", a.base);
    let body = json!({ "creator": creator, "amount": "1" });
    let (status, payout, _) = post(&client, &url, Some("after-release"), &body).await;
    assert_eq!(status, 201, "{payout}");
    assert_eq!(env.scalar_i64(&paid_sql).await, 1);
}
