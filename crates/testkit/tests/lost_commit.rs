//! The proxy loses exactly the answer it is told to: the transaction
//! commits on the server, its client sees COMMIT fail, and other
//! connections and statements pass through untouched.

use settled_testkit::{CommitFault, FaultPlan, PgProxy, TestDb};
use sqlx::{Connection, PgConnection};

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_whose_answer_is_lost_commits_and_fails_for_its_client_only() {
    let db = TestDb::create().await.unwrap();
    let plan = FaultPlan {
        armed_by: "INSERT INTO t".into(),
        fault: CommitFault::LoseAnswer,
        then_refuse: false,
    };
    let proxy = PgProxy::start(&db.url, plan).await;
    let mut through = PgConnection::connect(&proxy.url()).await.unwrap();
    sqlx::query("CREATE TABLE t (v int)")
        .execute(&mut through)
        .await
        .unwrap();
    // A transaction that does not run the statement commits normally.
    let mut tx = through.begin().await.unwrap();
    sqlx::query("SELECT count(*) FROM t").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    // The one that does (a prepared statement, bound by sqlx) commits on
    // the server, and its client learns nothing but a lost connection.
    let mut tx = through.begin().await.unwrap();
    sqlx::query("INSERT INTO t VALUES ($1)")
        .bind(7)
        .execute(&mut *tx)
        .await
        .unwrap();
    let lost = tx.commit().await.expect_err("the answer to COMMIT was lost");
    assert!(!matches!(lost, sqlx::Error::Database(_)), "{lost}");
    assert_eq!(proxy.faults(), 1);
    let mut direct = PgConnection::connect(&db.url).await.unwrap();
    let committed: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE v = 7")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(committed, 1, "the transaction committed");
    // One shot: the next connection's commits are answered.
    let mut again = PgConnection::connect(&proxy.url()).await.unwrap();
    let mut tx = again.begin().await.unwrap();
    sqlx::query("INSERT INTO t VALUES (8)").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(proxy.faults(), 1);
}
