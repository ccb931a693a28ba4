//! Claims: SKIP LOCKED never overlaps, key ranges cover every key once and
//! are shared by every process, "anything left?" sees exactly what is left.

use std::sync::Arc;

use settled_engine::RunState;
use settled_engine::{InTransaction, Worker};

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn claims_never_overlap_across_many_open_transactions() {
    let env = env(1_000).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    // Twenty transactions claim at once and hold their chunks open.
    let mut claims = Vec::new();
    for _ in 0..20 {
        let (pool, run_id) = (env.pool.clone(), run.id);
        claims.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let items = job()
                .queue()
                .claim_chunk_in_tx(&mut tx, SCOPE, 40, run_id)
                .await
                .unwrap();
            (tx, items)
        }));
    }
    let mut held = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for claim in claims {
        let (tx, items) = claim.await.unwrap();
        for item in &items {
            assert!(seen.insert(item.key.clone()), "{} claimed twice", item.key);
        }
        held.push(tx);
    }
    assert_eq!(seen.len(), 800, "twenty claims of forty, all distinct");
}

/// The key ranges claim loops share out: each key in exactly one range,
/// claims within a range in key order and skipping rows others hold, and
/// what a range's claims skipped found by a claim of the whole scope.
#[tokio::test(flavor = "multi_thread")]
async fn key_ranges_cover_every_key_once_and_range_claims_skip_held_rows() {
    let env = env(3_000).await;
    // Starting the run refreshes the statistics the ranges come from.
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    let queue = job().queue().clone();
    let mut conn = env.pool.acquire().await.unwrap();
    let bounds = queue.key_ranges(&mut conn, SCOPE, 100).await.unwrap();
    // 3,000 rows in ranges of 100 or more: at most 30 ranges (29 bounds), more than two.
    assert!((2..30).contains(&bounds.len()), "{} bounds", bounds.len());
    assert!(queue.key_ranges(&mut conn, SCOPE, 2_000).await.unwrap().is_empty());
    assert!(queue.key_ranges(&mut conn, "2026-01-01", 100).await.unwrap().is_empty());
    // Another transaction holds ten rows in the middle of the first range.
    let mut holder = env.pool.begin().await.unwrap();
    let held: Vec<String> = sqlx::query_scalar(
        "SELECT item FROM jobs.items WHERE day = $1::date AND item <= $2 ORDER BY item DESC LIMIT 10 FOR UPDATE",
    )
    .bind(SCOPE)
    .bind(&bounds[0])
    .fetch_all(&mut *holder)
    .await
    .unwrap();
    assert_eq!(held.len(), 10);
    let mut tx = env.pool.begin().await.unwrap();
    let mut seen = std::collections::HashSet::new();
    for range in 0..=bounds.len() {
        let upto = bounds.get(range).map(String::as_str);
        let mut after = range.checked_sub(1).map(|i| bounds[i].clone());
        loop {
            let window = settled_engine::raw::KeyWindow {
                after: after.as_deref(),
                upto,
            };
            let claimed = queue
                .claim_chunk_in_tx_window(&mut tx, SCOPE, 40, run.id, window)
                .await
                .unwrap();
            for item in &claimed {
                assert!(seen.insert(item.key.clone()), "{} claimed twice", item.key);
                assert!(!held.contains(&item.key), "{} is held by another transaction", item.key);
                assert!(
                    window.after.is_none_or(|a| item.key.as_str() > a),
                    "{} before its range",
                    item.key
                );
                assert!(
                    upto.is_none_or(|u| item.key.as_str() <= u),
                    "{} after its range",
                    item.key
                );
            }
            let keys: Vec<&str> = claimed.iter().map(|i| i.key.as_str()).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "a range's claim is in key order");
            if claimed.len() < 40 {
                break;
            }
            after = keys.last().map(|k| k.to_string());
        }
    }
    assert_eq!(seen.len(), 2_990, "every key not held, in exactly one range");
    holder.rollback().await.unwrap();
    // Another transaction, while the first still holds every range's rows.
    let mut sweep = env.pool.begin().await.unwrap();
    let rest = queue.claim_chunk_in_tx(&mut sweep, SCOPE, 40, run.id).await.unwrap();
    let mut rest: Vec<String> = rest.into_iter().map(|i| i.key).collect();
    let mut held = held;
    rest.sort();
    held.sort();
    assert_eq!(rest, held, "the whole scope's claim finds what the ranges skipped");
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_share_one_cut_of_key_ranges_visit_each_range_once_and_a_reopened_run_frees_them() {
    let env = env(6_000).await;
    for sql in SQL_TABLES {
        sqlx::query(sql).execute(&env.pool).await.unwrap();
    }
    let drainer = InTransaction(Arc::new(InSql));
    let cfg = config(100, 2);
    let workers = [
        Worker::register(&env.pool, "test").await.unwrap(),
        Worker::register(&env.pool, "test").await.unwrap(),
        Worker::register(&env.pool, "test").await.unwrap(),
        Worker::register(&env.pool, "test").await.unwrap(),
    ];
    let the_job = job();
    let drains = workers
        .iter()
        .map(|w| the_job.work(&env.pool, SCOPE, &drainer, &cfg, w));
    for outcome in futures_util::future::join_all(drains).await {
        outcome.unwrap();
    }
    let load = |get: fn(&settled_engine::DrainStats) -> &std::sync::atomic::AtomicU64| {
        workers
            .iter()
            .map(|w| get(w.stats()).load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
    };
    let (claims, chunks) = (load(|s| &s.claims), load(|s| &s.chunks_committed));
    let run = job().find_run(&env.pool, SCOPE).await.unwrap().unwrap();
    let of_ranges = |what: &'static str| {
        let sql = format!(
            "SELECT {what} FROM settled_engine.run_key_ranges WHERE run_id = {}",
            run.id
        );
        let pool = env.pool.clone();
        async move { count(&pool, &sql).await as u64 }
    };
    let (ranges, taken) = (of_ranges("count(*)").await, of_ranges("count(taken_at)").await);
    // 6,000 items in ranges of a chunk or more: one cut, every range taken.
    assert!((10..=61).contains(&ranges), "{ranges} ranges");
    assert_eq!(taken, ranges);
    // Each taken by its own statement (one statement taking them all would
    // stamp them with one time).
    let stamps = of_ranges("count(DISTINCT taken_at)").await;
    assert!(stamps > ranges / 2, "{stamps} take times for {ranges} ranges");
    // Inside a range, a loop claims its full chunks and at most two short
    // ones; with no range left, each of the eight loops sweeps the scope and
    // asks once more. Had every process visited every range (as loops did
    // before the ranges were shared), the claims would be about
    // chunks + 4 x ranges.
    assert!(
        claims <= chunks + 2 * ranges + 4 * 8,
        "{claims} claims for {chunks} chunks and {ranges} ranges"
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.sql_effects").await, 5_999);
    // item-77 failed (its effect refused); once its effect is allowed, a
    // retry reopens the run, which frees the ranges, and it settles.
    sqlx::query("ALTER TABLE jobs.sql_effects DROP CONSTRAINT sql_effects_item_check")
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(job().retry_failed(&env.pool, SCOPE, None).await.unwrap(), 1);
    assert_eq!(
        of_ranges("count(*) - count(taken_at)").await,
        ranges,
        "every range free again"
    );
    job().work(&env.pool, SCOPE, &drainer, &cfg, &workers[0]).await.unwrap();
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.sql_effects").await, 6_000);
    assert_eq!(
        job().find_run(&env.pool, SCOPE).await.unwrap().unwrap().state,
        RunState::Finished
    );
    for worker in workers {
        worker.deregister().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn anything_left_sees_eligible_and_processing_items_and_nothing_else() {
    let env = env(3).await;
    let queue = job().queue().clone();
    let mut conn = env.pool.acquire().await.unwrap();
    let set = |status: &'static str, item: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query(
                "UPDATE jobs.items SET status = $1,
                     lease_until = CASE WHEN $1 = 'processing' THEN now() + interval '1 minute' END
                 WHERE item = $2",
            )
            .bind(status)
            .bind(item)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    assert!(queue.has_unfinished(&mut conn, SCOPE).await.unwrap());
    set("settled", "item-1").await;
    set("failed", "item-2").await;
    assert!(
        queue.has_unfinished(&mut conn, SCOPE).await.unwrap(),
        "item-3 is eligible"
    );
    set("processing", "item-3").await;
    assert!(
        queue.has_unfinished(&mut conn, SCOPE).await.unwrap(),
        "item-3 is processing"
    );
    assert_eq!(queue.count_unfinished(&mut conn, SCOPE).await.unwrap(), 1);
    set("held", "item-3").await;
    assert!(!queue.has_unfinished(&mut conn, SCOPE).await.unwrap());
    assert_eq!(queue.count_unfinished(&mut conn, SCOPE).await.unwrap(), 0);
    assert!(
        !queue.has_unfinished(&mut conn, "2026-11-29").await.unwrap(),
        "an empty scope"
    );
    let err = queue.has_unfinished(&mut conn, "28.11.2026").await.unwrap_err();
    assert!(err.to_string().contains("is not a date"), "{err}");
}
