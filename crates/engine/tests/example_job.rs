//! The engine runs a job that is not settlement (examples/email_digest.rs).

#[path = "../../../examples/email_digest.rs"]
mod email_digest;

#[tokio::test]
async fn a_non_settlement_job_sends_every_digest_exactly_once() {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let (sent, enqueued) = email_digest::send_weekly_digests(&pool, "2026-11-23", 2_000)
        .await
        .unwrap();
    assert_eq!(enqueued, 2_000);
    assert_eq!(sent, 2_000);
    // A second pass finds the run finished and sends nothing more.
    let again = email_digest::send_weekly_digests(&pool, "2026-11-23", 2_000).await;
    let sent_after: i64 = sqlx::query_scalar("SELECT count(*) FROM digest.sent")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sent_after, 2_000, "{again:?}");
    pool.close().await;
}
