//! Idempotency keys past their retention, payouts behind a locked balance, balances past 78 digits.

use super::*;

async fn settled_creator(env: &Env) -> (String, String) {
    env.seed(10);
    env.run_ok(&["worker", "--period", PERIOD]);
    sqlx::query_as("SELECT creator, balance::text FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_used_after_its_retention_answers_its_own_payout_never_a_second() {
    let env = Env::new().await;
    let (creator, before) = settled_creator(&env).await;
    let server = env.serve(TOKEN).await;
    let body = json!({ "creator": creator, "amount": "1000" });
    let (status, first, _) = pay(&server.base, "old-key", &body).await;
    assert_eq!(status, 201, "{first}");
    // The retention ends and the key's stored response is pruned.
    sqlx::query("DELETE FROM settled_engine.idempotency_keys WHERE key = 'old-key'")
        .execute(&env.pool)
        .await
        .unwrap();
    let (status, again, replayed) = pay(&server.base, "old-key", &body).await;
    assert_eq!(status, 201, "{again}");
    assert!(replayed, "the answer is the earlier payout's");
    assert_eq!(again["id"], first["id"]);
    sqlx::query("DELETE FROM settled_engine.idempotency_keys WHERE key = 'old-key'")
        .execute(&env.pool)
        .await
        .unwrap();
    let other = json!({ "creator": creator, "amount": "7" });
    let (status, refused, _) = pay(&server.base, "old-key", &other).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["type"], "/problems/idempotency-key-reused");
    common::assert_one_payout_of_1000(&env, &creator, &before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn past_its_retention_a_key_that_paid_stays_its_requests_and_a_late_repeat_of_it_is_never_blamed() {
    let env = Env::new().await;
    let (creator, before) = settled_creator(&env).await;
    let server = env.serve(TOKEN).await;
    let original = json!({ "creator": creator, "amount": "1000" });
    let other = json!({ "creator": creator, "amount": "7" });
    let (status, first, _) = pay(&server.base, "kept", &original).await;
    assert_eq!(status, 201, "{first}");
    let expire =
        "UPDATE settled_engine.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'kept'";
    for pruned in [false, true] {
        // The retention ends (and, the second time, the key is pruned).
        sqlx::query(expire).execute(&env.pool).await.unwrap();
        if pruned {
            settled_engine::once::idempotency::prune(&env.pool).await.unwrap();
        }
        // Another request cannot take the key over, however often it tries...
        for _ in 0..2 {
            let (status, refused, _) = pay(&server.base, "kept", &other).await;
            assert_eq!(status, 422, "pruned {pruned}: {refused}");
            assert_eq!(refused["type"], "/problems/idempotency-key-reused");
        }
        // ...and a late repeat of the original gets its payout, not a 422
        // that blames it for the other request.
        let (status, again, replayed) = pay(&server.base, "kept", &original).await;
        assert_eq!(status, 201, "pruned {pruned}: {again}");
        assert!(replayed);
        assert_eq!(again["id"], first["id"]);
    }
    common::assert_one_payout_of_1000(&env, &creator, &before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payout_behind_a_locked_balance_gives_up_with_503_and_retry_after_then_pays_once() {
    let env = Env::new().await;
    let (creator, _) = settled_creator(&env).await;
    let server = env.serve(TOKEN).await;
    use sqlx::Connection;
    let mut blocker = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settlement.creator_balance WHERE creator = $1 FOR UPDATE")
        .bind(&creator)
        .execute(&mut *tx)
        .await
        .unwrap();
    let body = json!({ "creator": creator, "amount": "5" });
    let response = reqwest::Client::new()
        .post(format!("{}/v1/payouts", server.base))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "waits")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/database-busy", "{problem}");
    tx.rollback().await.unwrap();
    let (status, paid, _) = pay(&server.base, "waits", &body).await;
    assert_eq!(status, 201, "{paid}");
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_balance_past_78_digits_keeps_growing_and_a_run_without_a_date_scope_leaves_the_front_page_up() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-27", "--creators", "3"]);
    env.run_ok(&["worker", "--period", "2026-11-27"]);
    // A creator nine periods of maximum volume in: its balance is at the
    // old column's limit.
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance LIMIT 1")
        .await;
    sqlx::query("UPDATE settlement.creator_balance SET balance = repeat('9', 78)::numeric WHERE creator = $1")
        .bind(&creator)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO settlement.settlement_policy (period, fee_bps) VALUES ('2026-11-28', 100)")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("SELECT settlement.ensure_period_partitions('2026-11-28')")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO settlement.token_trade_volume (period, creator, volume)
         VALUES ('2026-11-28', $1, 2::numeric ^ 255)",
    )
    .bind(&creator)
    .execute(&env.pool)
    .await
    .unwrap();
    env.run_ok(&["worker", "--period", PERIOD]);
    let status = env
        .scalar_text("SELECT status FROM settlement.token_trade_volume WHERE period = '2026-11-28'")
        .await;
    assert_eq!(status, "settled", "the item is paid, not failed by a numeric overflow");
    let digits = env
        .scalar_i64(&format!(
            "SELECT length(balance::text)::bigint FROM settlement.creator_balance WHERE creator = '{creator}'"
        ))
        .await;
    assert_eq!(digits, 79);
    // A runs row whose scope is not a date (written by hand) is listed, the
    // page still answers.
    sqlx::query("INSERT INTO settled_engine.runs (job, scope, state, finished_at) VALUES ('creator-rewards', 'not-a-date', 'finished', now())")
        .execute(&env.pool)
        .await
        .unwrap();
    let server = env.serve(TOKEN).await;
    let page = common::client_with(TOKEN)
        .get(format!("{}/", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains("not-a-date") && page.contains(PERIOD), "{page}");
    // Amounts for people: whole tokens (18 decimals) next to base units.
    let paid = env
        .scalar_text("SELECT sum(amount)::text FROM settlement.reward_ledger WHERE period = '2026-11-27'")
        .await;
    let tokens = settled::money::tokens(&paid, 18);
    assert!(tokens.contains(',') || paid.len() <= 21, "{paid} -> {tokens}");
    assert!(
        page.contains(&tokens) && page.contains(&paid),
        "{tokens} / {paid} not on the page"
    );
    let status = env.run_ok(&["status", "--period", "2026-11-27", "--token-decimals", "6"]);
    let six = settled::money::tokens(&paid, 6);
    assert!(
        status.contains(&format!("paid {six} of {six} tokens (6 decimals)"))
            && status.contains(&format!("paid {paid} of {paid} (base units)")),
        "{status}"
    );
}
