//! Several OS processes drain one scope, each item done once.

use std::time::Duration;

use settled_engine::RunState;
use settled_engine::Worker;
use sqlx::postgres::PgPoolOptions;

use crate::common::*;

/// Set for the child processes of the test below.
const CHILD_URL: &str = "ENGINE_TEST_CHILD_URL";

#[test]
#[ignore = "a child process of several_processes_drain_one_scope_and_each_item_is_done_once"]
fn child_drains_the_scope() {
    let Ok(url) = std::env::var(CHILD_URL) else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = PgPoolOptions::new().max_connections(6).connect(&url).await.unwrap();
        let worker = Worker::register(&pool, "child").await.unwrap();
        // Start together: every child waits until all four have registered.
        while count(
            &pool,
            "SELECT count(*) FROM settled_engine.workers WHERE version = 'child'",
        )
        .await
            < 4
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        job()
            .work(&pool, SCOPE, &drainer(&[]), &config(25, 2), &worker)
            .await
            .unwrap();
        worker.deregister().await;
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn several_processes_drain_one_scope_and_each_item_is_done_once() {
    let env = env(6_000).await;
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "processes::child_drains_the_scope",
                    "--ignored",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD_URL, &env.db.url)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    // The effects' primary key would have refused a second one; every item
    // is settled once, the run finished once, and every process did work.
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.effects").await, 6_000);
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.items WHERE status = 'settled'").await,
        6_000
    );
    assert_eq!(
        job().find_run(&env.pool, SCOPE).await.unwrap().unwrap().state,
        RunState::Finished
    );
    let busy = count(
        &env.pool,
        "SELECT count(*) FROM settled_engine.workers WHERE host IS NOT NULL AND version = 'child' AND items_settled > 0",
    )
    .await;
    assert_eq!(busy, 4, "each process settled some: SKIP LOCKED split the work");
}
