//! Partitions: either mode drains a scope while another scope's partition
//! is locked whole.

use std::sync::Arc;
use std::time::Duration;

use settled_engine::{Chunk, HandlerError, InTransaction, Worker};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

use crate::common::*;

/// Leased handler for the partition test: each item takes a little while
/// (so renewals run while items are out), its effect written at completion.
struct SlowLeased;

impl settled_engine::LeasedHandler for SlowLeased {
    type Batch = ();

    async fn prepare(&self, _pool: &PgPool, _chunk: &Chunk) -> Result<(), HandlerError> {
        Ok(())
    }

    fn held(&self, _batch: &()) -> Vec<String> {
        Vec::new()
    }

    async fn work_item(
        &self,
        _batch: &(),
        _chunk: &Chunk,
        _item: &settled_engine::ClaimedItem,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }

    async fn commit(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        record_effects(tx, chunk).await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn scopes_drain_in_either_mode_while_another_scopes_partition_is_locked_whole() {
    // A work table partitioned by scope, on sessions with custom plans
    // (settled_engine::raw::session): every statement of a drain, however often
    // it runs, plans and locks only its own scope's partition. Another
    // session holds an older scope's partition in ACCESS EXCLUSIVE mode (as
    // a detach or a drop would) through both drains; a statement that
    // needed it would wait for ever, and the timeouts fail the test.
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .after_connect(|conn, _| {
            Box::pin(async move {
                settled_engine::raw::session::use_custom_plans(conn)
                    .await
                    .map_err(|e| sqlx::Error::Configuration(e.into()))
            })
        })
        .connect(&db.url)
        .await
        .unwrap();
    settled_engine::migrate(&pool).await.unwrap();
    let partitioned: Vec<String> = TABLE_SQL
        .iter()
        .map(|sql| match sql.starts_with("CREATE TABLE jobs.items") {
            true => format!("{sql} PARTITION BY RANGE (day)"),
            false => sql.to_string(),
        })
        .collect();
    for sql in &partitioned {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    for sql in SQL_TABLES {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    for (day, next) in [
        ("2026-11-27", "2026-11-28"),
        ("2026-11-28", "2026-11-29"),
        ("2026-11-29", "2026-11-30"),
        ("2026-11-30", "2026-12-01"),
    ] {
        let name = day.replace('-', "");
        sqlx::query(&format!(
            "CREATE TABLE jobs.items_p{name} PARTITION OF jobs.items FOR VALUES FROM ('{day}') TO ('{next}')"
        ))
        .execute(&pool)
        .await
        .unwrap();
    }
    add_items(&pool, "2026-11-27", 10).await;
    add_items(&pool, SCOPE, 2_000).await;
    add_items(&pool, "2026-11-29", 600).await;
    add_items(&pool, "2026-11-30", 1_500).await;

    let mut holder = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE jobs.items_p20261127 IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();

    let worker = Worker::register(&pool, "test").await.unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        job().work(&pool, SCOPE, &drainer(&[]), &config(10, 3), &worker),
    )
    .await
    .expect("the in-transaction drain waited on another scope's partition")
    .unwrap();
    assert!(
        matches!(outcome, settled_engine::WorkOutcome::Drained { finished: true, .. }),
        "{outcome:?}"
    );

    let leased = settled_engine::Leased {
        handler: Arc::new(SlowLeased),
        leases: settled_engine::LeaseConfig {
            // Long enough that a late renewal on a loaded machine is never
            // rescued (one attempt each: a rescue would fail the item).
            ttl: Duration::from_secs(5),
            rescue_interval: Duration::from_millis(100),
            shutdown_grace: Duration::from_millis(300),
            calls_in_flight: 8,
        },
    };
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        job().work(&pool, "2026-11-29", &leased, &config(20, 2), &worker),
    )
    .await
    .expect("the leased drain waited on another scope's partition")
    .unwrap();
    assert!(
        matches!(outcome, settled_engine::WorkOutcome::Drained { finished: true, .. }),
        "{outcome:?}"
    );

    // One statement per chunk, on the scope's own partition: 150 chunks, so
    // the statement's plan is soon a cached generic one, which still names
    // only that partition; item-77's chunk fails and is retried in halves.
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        job().work(
            &pool,
            "2026-11-30",
            &InTransaction(Arc::new(InSql)),
            &config(10, 2),
            &worker,
        ),
    )
    .await
    .expect("the one-statement drain waited on another scope's partition")
    .unwrap();
    assert!(
        matches!(outcome, settled_engine::WorkOutcome::Drained { finished: true, .. }),
        "{outcome:?}"
    );
    worker.deregister().await;

    // The holder held on throughout.
    let held: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE granted AND mode = 'AccessExclusiveLock'
                        AND relation = 'jobs.items_p20261127'::regclass)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(held);
    holder.rollback().await.unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM jobs.effects").await, 2_600);
    // InSql's effects refuse item-77, which fails alone.
    assert_eq!(count(&pool, "SELECT count(*) FROM jobs.sql_effects").await, 1_499);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM jobs.items WHERE status = 'settled'").await,
        4_099
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM jobs.items WHERE day = '2026-11-27' AND status = 'eligible'"
        )
        .await,
        10
    );
    drop(pool);
    drop(db);
}
