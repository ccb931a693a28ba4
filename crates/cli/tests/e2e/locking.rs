//! The PostgreSQL facts the design stands on, shown on the real schema:
//! SKIP LOCKED claimers never wait for each other while a plain FOR UPDATE
//! does, and OFFSET paging locks every row it skips.

use crate::common;

use std::time::Duration;

use common::{Env, PERIOD};
use sqlx::{Connection, PgConnection};

/// The engine's own in-transaction claim of ten items (what every worker sends).
async fn engine_claim(conn: &mut PgConnection, run_id: i64) -> Vec<String> {
    settled::settlement::queue()
        .claim_chunk_in_tx(conn, PERIOD, 10, run_id)
        .await
        .unwrap()
        .into_iter()
        .map(|item| item.key)
        .collect()
}

async fn seeded(creators: &str) -> Env {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", creators]);
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn skip_locked_claimers_pass_each_other_while_plain_for_update_waits() {
    let env = seeded("100").await;
    env.run_ok(&["run", "--period", PERIOD]);
    let run_id = env.scalar_i64("SELECT id FROM settled_engine.runs").await;
    let mut a = PgConnection::connect(&env.db.url).await.unwrap();
    let mut b = PgConnection::connect(&env.db.url).await.unwrap();
    let mut c = PgConnection::connect(&env.db.url).await.unwrap();
    let mut observer = PgConnection::connect(&env.db.url).await.unwrap();

    sqlx::query("BEGIN").execute(&mut a).await.unwrap();
    let a_rows = engine_claim(&mut a, run_id).await;
    assert_eq!(a_rows.len(), 10);

    // B gets the next ten at once: it skips A's rows instead of waiting.
    sqlx::query("BEGIN").execute(&mut b).await.unwrap();
    let b_rows = tokio::time::timeout(Duration::from_secs(10), engine_claim(&mut b, run_id))
        .await
        .expect("a SKIP LOCKED claim must not wait");
    assert_eq!(b_rows.len(), 10);
    assert!(
        a_rows.iter().all(|r| !b_rows.contains(r)),
        "A and B claimed the same row"
    );

    // C, with a plain FOR UPDATE of A's rows, queues behind A's row locks.
    let c_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let a_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut a)
        .await
        .unwrap();
    let wanted = a_rows.clone();
    let waiter = tokio::spawn(async move {
        sqlx::query("BEGIN").execute(&mut c).await.unwrap();
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT creator FROM settlement.token_trade_volume
             WHERE period = '2026-11-28' AND status = 'eligible' AND creator = ANY($1)
             ORDER BY creator FOR UPDATE",
        )
        .bind(wanted)
        .fetch_all(&mut c)
        .await
        .unwrap();
        sqlx::query("ROLLBACK").execute(&mut c).await.unwrap();
        rows
    });

    // pg_locks shows C waiting (granted = false) on a lock A holds.
    let mut seen = None;
    for _ in 0..100 {
        let row: Option<(String, bool, Vec<i32>)> = sqlx::query_as(
            "SELECT l.locktype, l.granted, pg_blocking_pids(l.pid)
             FROM pg_locks l WHERE l.pid = $1 AND NOT l.granted",
        )
        .bind(c_pid)
        .fetch_optional(&mut observer)
        .await
        .unwrap();
        if row.is_some() {
            seen = row;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (locktype, granted, blockers) = seen.expect("C never showed up waiting in pg_locks");
    assert!(!granted);
    assert!(["transactionid", "tuple"].contains(&locktype.as_str()), "{locktype}");
    assert!(blockers.contains(&a_pid), "C should wait for A, waits for {blockers:?}");
    assert!(!waiter.is_finished(), "C did not wait");

    // A and B still hold theirs: granted locks on the table in both backends.
    let holders: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT l.pid) FROM pg_locks l
         WHERE l.relation = 'settlement.token_trade_volume'::regclass
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.granted AND l.mode = 'RowShareLock'",
    )
    .fetch_one(&mut observer)
    .await
    .unwrap();
    assert!(holders >= 2, "A and B should hold RowShareLock, saw {holders}");

    sqlx::query("COMMIT").execute(&mut a).await.unwrap();
    let c_rows = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    let mut a_sorted = a_rows.clone();
    a_sorted.sort();
    assert_eq!(c_rows, a_sorted, "once A is gone, C locks the rows it waited for");
    sqlx::query("COMMIT").execute(&mut b).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn offset_paging_locks_every_row_it_skips() {
    let env = seeded("2000").await;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pgrowlocks")
        .execute(&env.pool)
        .await
        .unwrap();
    let mut pager = PgConnection::connect(&env.db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut pager).await.unwrap();
    let page: Vec<String> = sqlx::query_scalar(
        "SELECT creator FROM settlement.token_trade_volume
         WHERE period = '2026-11-28' ORDER BY period, creator OFFSET 1000 LIMIT 10 FOR UPDATE",
    )
    .fetch_all(&mut pager)
    .await
    .unwrap();
    assert_eq!(page.len(), 10);
    let locked: i64 = sqlx::query_scalar("SELECT count(*) FROM pgrowlocks('settlement.token_trade_volume_p20261128')")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(locked, 1010, "OFFSET 1000 LIMIT 10 FOR UPDATE should lock 1,010 rows");
    sqlx::query("ROLLBACK").execute(&mut pager).await.unwrap();

    // The engine's claim locks exactly the rows it returns.
    sqlx::query("BEGIN").execute(&mut pager).await.unwrap();
    env.run_ok(&["run", "--period", PERIOD]);
    let run_id = env.scalar_i64("SELECT id FROM settled_engine.runs").await;
    let claimed = engine_claim(&mut pager, run_id).await;
    let locked: i64 = sqlx::query_scalar("SELECT count(*) FROM pgrowlocks('settlement.token_trade_volume_p20261128')")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!((claimed.len(), locked), (10, 10));
    sqlx::query("ROLLBACK").execute(&mut pager).await.unwrap();
}
