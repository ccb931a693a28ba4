//! The one-statement chunk: settle, hold and isolate a failing item; the
//! statement names its scope's own relation.

use std::sync::Arc;

use settled_engine::{ChunkHandler, InTransaction, Worker};
use settled_engine::{RunState, WorkQueue};
use sqlx::postgres::PgPoolOptions;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn one_statement_chunks_settle_hold_and_isolate_a_failing_item_with_two_workers_at_once() {
    let env = env(3_000).await;
    for sql in SQL_TABLES {
        sqlx::query(sql).execute(&env.pool).await.unwrap();
    }
    sqlx::query("INSERT INTO jobs.holds VALUES ('item-5'), ('item-6')")
        .execute(&env.pool)
        .await
        .unwrap();
    let drainer = InTransaction(Arc::new(InSql));
    let (a, b) = (
        Worker::register(&env.pool, "test").await.unwrap(),
        Worker::register(&env.pool, "test").await.unwrap(),
    );
    let (the_job, cfg) = (job(), config(100, 4));
    let (ra, rb) = tokio::join!(
        the_job.work(&env.pool, SCOPE, &drainer, &cfg, &a),
        the_job.work(&env.pool, SCOPE, &drainer, &cfg, &b),
    );
    ra.unwrap();
    rb.unwrap();
    let (sa, sb) = (a.stats().clone(), b.stats().clone());
    a.deregister().await;
    b.deregister().await;
    // Only the failing item failed: a chunk re-claimed after its failure
    // (thinned by the other worker meanwhile) is run again as a set before
    // any of it is failed, so no good item fails for item-77's error.
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.items WHERE status = 'failed'").await,
        1,
        "only item-77 failed"
    );
    let settled = |s: &settled_engine::DrainStats| s.items_settled.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(settled(&sa) + settled(&sb), 2_997, "all but two held and one failing");
    assert!(settled(&sa) > 0 && settled(&sb) > 0, "both workers worked");
    assert!(
        sa.chunks_split.load(std::sync::atomic::Ordering::Relaxed)
            + sb.chunks_split.load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "the failing chunk was split"
    );
    // One effect per settled item (the key refuses a second), each with the
    // item's own attempt as its fence and the run's id.
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.sql_effects").await, 2_997);
    let run = job().find_run(&env.pool, SCOPE).await.unwrap().unwrap();
    assert_eq!(run.state, RunState::Finished);
    assert_eq!(
        count(
            &env.pool,
            &format!(
                "SELECT count(*) FROM jobs.sql_effects e JOIN jobs.items i USING (day, item)
                 WHERE i.status = 'settled' AND e.fence = i.attempt AND e.run = {}",
                run.id
            )
        )
        .await,
        2_997
    );
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.items WHERE status = 'held'").await,
        2
    );
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.items WHERE status = 'failed' AND item = 'item-77' AND last_error LIKE '%check%'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.sql_effects WHERE item IN ('item-5', 'item-6', 'item-77')"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn chunk_statements_name_the_one_relation_of_a_scope_and_claim_nothing_once_it_is_detached() {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPoolOptions::new().max_connections(5).connect(&db.url).await.unwrap();
    settled_engine::migrate(&pool).await.unwrap();
    for sql in TABLE_SQL {
        let sql = match sql.starts_with("CREATE TABLE jobs.items") {
            true => format!("{sql} PARTITION BY RANGE (day)"),
            false => sql.to_string(),
        };
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    for sql in [
        "CREATE TABLE jobs.items_a PARTITION OF jobs.items FOR VALUES FROM ('2026-11-28') TO ('2026-11-29')",
        "CREATE TABLE jobs.items_empty PARTITION OF jobs.items FOR VALUES FROM ('2026-11-29') TO ('2026-11-30')",
        // A scope spread over sub-partitions has no one relation.
        "CREATE TABLE jobs.items_sub PARTITION OF jobs.items FOR VALUES FROM ('2026-11-30') TO ('2026-12-01')
             PARTITION BY HASH (item)",
        "CREATE TABLE jobs.items_sub0 PARTITION OF jobs.items_sub FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
        "CREATE TABLE jobs.items_sub1 PARTITION OF jobs.items_sub FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
        // A plain table is its own one relation; one with inheritance children is not.
        "CREATE TABLE jobs.plain (LIKE jobs.items INCLUDING DEFAULTS)",
        "CREATE TABLE jobs.parent (LIKE jobs.items INCLUDING DEFAULTS)",
        "CREATE TABLE jobs.child () INHERITS (jobs.parent)",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    add_items(&pool, SCOPE, 300).await;
    add_items(&pool, "2026-11-30", 50).await;
    let sql = InSql.chunk_sql().unwrap();
    let queue_on = |table: &str| {
        let mut spec = job().queue().spec().clone();
        spec.table = table.into();
        WorkQueue::new(spec).unwrap()
    };
    let mut conn = pool.acquire().await.unwrap();
    let on_relation = |statements: settled_engine::ChunkStatements| statements.on_scope_relation();
    let queue: WorkQueue = (**job().queue()).clone();
    for (queue, scope, expected) in [
        (&queue, SCOPE, true),
        (&queue, "2026-11-29", false),
        (&queue, "2026-11-30", false),
        (&queue_on("jobs.plain"), SCOPE, true),
        (&queue_on("jobs.parent"), SCOPE, false),
    ] {
        let statements = queue.chunk_statements_for(&mut conn, scope, &sql).await.unwrap();
        assert_eq!(on_relation(statements), expected, "{} {scope}", queue.spec().table);
    }
    for sql in SQL_TABLES {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }

    // A drain's statements, then the scope's partition detached under them:
    // a chunk claims nothing from the table that is no longer the queue's.
    let run = job().start_or_join(&pool, SCOPE, None).await.unwrap().run;
    let statements = queue.chunk_statements_for(&mut conn, SCOPE, &sql).await.unwrap();
    drop(conn);
    // One chunk of up to 100 in its own transaction, committed.
    let chunk = || async {
        let mut conn = pool.acquire().await.unwrap();
        let mut tx = statements.begin(&mut conn).await.unwrap();
        let done = statements
            .run(&mut tx, SCOPE, 100, run.id, settled_engine::raw::KeyWindow::ALL)
            .await
            .unwrap()
            .unwrap();
        tx.commit().await.unwrap();
        done
    };
    let done = chunk().await;
    assert_eq!((done.claimed, done.settled), (100, 100));
    sqlx::query("ALTER TABLE jobs.items DETACH PARTITION jobs.items_a")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(chunk().await.claimed, 0, "claimed from a detached partition");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM jobs.items_a WHERE status = 'eligible'").await,
        200
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM jobs.sql_effects").await, 100);
    drop(pool);
    drop(db);
}
