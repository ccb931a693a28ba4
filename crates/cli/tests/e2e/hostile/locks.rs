//! The lock view hides other sessions' secrets; costly pages wait on their own pool.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_lock_view_hides_other_sessions_literals_unless_the_token_is_sent() {
    let env = Env::new().await;
    // As the owner: under its least role, PostgreSQL itself shows other
    // roles' query text as `<insufficient privilege>`.
    let server = env.serve_as_login(TOKEN, &[]).await;
    // Another session, mid-transaction, whose statement holds a secret.
    let mut other = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    use sqlx::Connection;
    let role = format!("hostile_{}", std::process::id());
    let mut tx = other.begin().await.unwrap();
    sqlx::query(&format!("CREATE ROLE {role} LOGIN PASSWORD 'S3cr3t-pw'"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let (page, admins_page) = lock_pages(&env, &server).await;
    assert!(page.contains(&format!("CREATE ROLE {role} LOGIN PASSWORD ?")), "{page}");
    assert!(!page.contains("S3cr3t"), "the lock view showed a password");
    assert!(
        admins_page.contains("S3cr3t-pw"),
        "with the token the query is shown whole"
    );
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lock_view_hides_setting_values_and_nested_comments_of_other_sessions() {
    let env = Env::new().await;
    let server = env.serve_as_login(TOKEN, &[]).await;
    // Another session, mid-transaction, holding a lock on a settlement
    // table; its last query string sets two values without quotes and
    // ends in a comment nested in a comment (PostgreSQL's comments nest).
    use sqlx::Connection;
    let mut other = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::raw_sql(
        "LOCK TABLE settlement.payouts IN ROW EXCLUSIVE MODE; \
         SET LOCAL my.to_value TO S3cr3tTo; SET LOCAL my.eq_value = S3cr3tEq; \
         SELECT 1 /* a /* b */ S3cr3tComment */",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let (page, admins_page) = lock_pages(&env, &server).await;
    assert!(
        page.contains("SET LOCAL my.to_value TO ?; SET LOCAL my.eq_value = ?;"),
        "{page}"
    );
    assert!(
        !page.to_lowercase().contains("s3cr3t"),
        "the lock view showed a secret: {page}"
    );
    for secret in ["S3cr3tTo", "S3cr3tEq", "S3cr3tComment"] {
        assert!(
            admins_page.contains(secret),
            "with the token the query is shown whole: {admins_page}"
        );
    }
    tx.rollback().await.unwrap();
}

/// The lock view (`/locks`) as a viewer's token sees it, literals hidden,
/// then as the admin's (SETTLED_API_TOKEN) does, queries whole.
async fn lock_pages(env: &Env, server: &Server) -> (String, String) {
    let viewer = env.run_ok(&["tokens", "create", "--name", "viewer", "--role", "viewer"]);
    let locks = |token: &str| {
        let request = reqwest::Client::new()
            .get(format!("{}/locks", server.base))
            .bearer_auth(token);
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    (locks(viewer.trim()).await, locks(TOKEN).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn costly_pages_wait_on_their_own_pool_and_share_one_verification_while_payouts_and_healthz_go_on() {
    let env = Env::new().await;
    env.seed(2000);
    env.run_ok(&["worker", "--period", PERIOD]);
    let run_id = env.scalar_i64("SELECT id FROM settled_engine.runs").await;
    let (creator, _) = sqlx::query_as::<_, (String, String)>(
        "SELECT creator, balance::text FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let server = env.serve(TOKEN).await;
    // Every page reads the ledger: with it locked, each page holds its
    // connection until the lock goes, the worst a slow page can do.
    use sqlx::Connection;
    let mut blocker = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query("LOCK TABLE settlement.reward_ledger IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut readers = tokio::task::JoinSet::new();
    for i in 0..60 {
        let url = if i % 3 == 0 {
            format!("{}/", server.base)
        } else {
            format!("{}/runs/{run_id}", server.base)
        };
        readers.spawn(async move {
            let response = common::client_with(TOKEN).get(url).send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = reqwest::Client::new();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "/healthz while 60 pages wait"
    );
    let (status, paid, _) = pay(
        &server.base,
        "during-pages",
        &json!({ "creator": creator, "amount": "3" }),
    )
    .await;
    assert_eq!(status, 201, "a payout while 60 pages wait: {paid}");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'settled-serve-reads' AND wait_event_type = 'Lock'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(waiting >= 1, "the pages wait on their own pool's connections");
    tx.rollback().await.unwrap();
    while let Some(page) = readers.join_next().await {
        let (status, page) = page.unwrap();
        assert_eq!(status, 200, "{page}");
        assert!(page.contains(PERIOD), "{page}");
        if page.contains("verification") {
            assert!(page.contains("every check holds"), "{page}");
            assert!(page.contains("stored report"), "a finished run shows its stored report");
        }
    }
    assert_eq!(
        metric(&server.base, "settled_dashboard_verifications_total").await,
        1.0,
        "40 readers within the interval share one verification"
    );
}
