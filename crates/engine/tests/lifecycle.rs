//! The engine's own suite, on a generic work table (`jobs.items`) with a
//! scripted handler, with real concurrency (many connections, many claim
//! loops, many daemons): no settlement anywhere.

use std::sync::Arc;
use std::time::Duration;

use settled_engine::daemon::DaemonConfig;
use settled_engine::raw::{Cancelled, RetryPolicy, RunState, Schedule, WorkQueue};
use settled_engine::{
    Chunk, ChunkHandler, DrainConfig, EngineError, Handled, HandlerError, InTransaction, Job, NoHooks, QueueSpec,
    Worker,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

const SCOPE: &str = "2026-11-28";

const TABLE_SQL: &[&str] = &[
    "CREATE SCHEMA jobs",
    "CREATE TABLE jobs.items (
        day date NOT NULL, item text NOT NULL,
        status text NOT NULL DEFAULT 'eligible', attempt integer NOT NULL DEFAULT 0,
        attempt_base integer NOT NULL DEFAULT 0, fence_epoch integer NOT NULL DEFAULT 0, lease_owner uuid, lease_until timestamptz,
        not_before timestamptz, last_error text, updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (day, item))",
    "CREATE INDEX ON jobs.items (day, item) WHERE status = 'eligible'",
    "CREATE INDEX ON jobs.items (day, lease_until) WHERE status = 'processing'",
    "CREATE INDEX ON jobs.items (item) WHERE status = 'held'",
    // The effect: its primary key refuses a second one.
    "CREATE TABLE jobs.effects (day date NOT NULL, item text NOT NULL, fence integer NOT NULL, PRIMARY KEY (day, item))",
];

fn job() -> Job<NoHooks> {
    Job::new(
        WorkQueue::new(QueueSpec {
            job: "generic".into(),
            table: "jobs.items".into(),
            scope_column: "day".into(),
            scope_type: "date".into(),
            key_column: "item".into(),
            key_type: "text".into(),
        })
        .unwrap(),
        NoHooks,
    )
}

struct Env {
    pool: PgPool,
    db: settled_testkit::TestDb,
}

async fn env(items: i64) -> Env {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPoolOptions::new().max_connections(60).connect(&db.url).await.unwrap();
    settled_engine::migrate(&pool).await.unwrap();
    for sql in TABLE_SQL {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    add_items(&pool, SCOPE, items).await;
    Env { pool, db }
}

async fn add_items(pool: &PgPool, scope: &str, items: i64) {
    sqlx::query("INSERT INTO jobs.items (day, item) SELECT $1::date, 'item-' || i FROM generate_series(1, $2) i")
        .bind(scope)
        .bind(items)
        .execute(pool)
        .await
        .unwrap();
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Records each item's effect with its fence; refuses the keys in `poison`.
struct Scripted {
    poison: Vec<String>,
}

impl ChunkHandler for Scripted {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        if let Some(bad) = chunk.items.iter().find(|i| self.poison.contains(&i.key)) {
            return Err(HandlerError::Permanent(format!("{} is poison", bad.key)));
        }
        sqlx::query("INSERT INTO jobs.effects SELECT $1::date, k, f FROM unnest($2::text[], $3::int[]) AS x(k, f)")
            .bind(&chunk.scope)
            .bind(chunk.keys())
            .bind(chunk.fences())
            .execute(tx)
            .await?;
        Ok(Handled::default())
    }
}

fn drainer(poison: &[&str]) -> InTransaction<Scripted> {
    InTransaction(Arc::new(Scripted {
        poison: poison.iter().map(|s| s.to_string()).collect(),
    }))
}

fn config(chunk: u32, concurrency: u32) -> DrainConfig {
    DrainConfig {
        chunk,
        concurrency,
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..DrainConfig::default()
    }
}

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
async fn a_zombies_completion_is_refused_by_its_fence() {
    let env = env(10).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    let queue = job().queue().clone();
    let (zombie, other) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let mut conn = env.pool.acquire().await.unwrap();
    let lost = queue
        .claim_leased(&mut conn, SCOPE, 10, run.id, zombie, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(lost.len(), 10);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rescued = queue
        .rescue_expired(
            &mut conn,
            SCOPE,
            &RetryPolicy {
                backoff_base_ms: 0,
                ..RetryPolicy::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(rescued.retried, 10);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let fresh = queue
        .claim_leased(&mut conn, SCOPE, 10, run.id, other, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(fresh.len(), 10);
    assert!(fresh
        .iter()
        .all(|f| lost.iter().all(|l| l.key != f.key || l.fence < f.fence)));
    // The zombie wakes and completes with its old fences: nothing accepted.
    let mut tx = env.pool.begin().await.unwrap();
    assert!(queue.complete_fenced(&mut tx, SCOPE, &lost).await.unwrap().is_empty());
    tx.commit().await.unwrap();
    let mut tx = env.pool.begin().await.unwrap();
    assert_eq!(queue.complete_fenced(&mut tx, SCOPE, &fresh).await.unwrap().len(), 10);
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_leases_are_rescued_and_fail_once_their_attempts_are_spent() {
    let env = env(5).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    let queue = job().queue().clone();
    let mut conn = env.pool.acquire().await.unwrap();
    let policy = RetryPolicy {
        max_attempts: 2,
        backoff_base_ms: 0,
        backoff_cap_ms: 0,
    };
    for round in 1..=2 {
        let worker = uuid::Uuid::new_v4();
        let claimed = queue
            .claim_leased(&mut conn, SCOPE, 5, run.id, worker, Duration::from_millis(300))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 5, "round {round}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let outcome = queue.rescue_expired(&mut conn, SCOPE, &policy).await.unwrap();
        if round == 1 {
            assert_eq!((outcome.retried, outcome.failed), (5, 0));
        } else {
            assert_eq!((outcome.retried, outcome.failed), (0, 5));
        }
    }
    let failed = count(
        &env.pool,
        "SELECT count(*) FROM jobs.items WHERE status = 'failed' AND last_error LIKE 'lease expired%'",
    )
    .await;
    assert_eq!(failed, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_item_fails_alone_and_the_rest_settle_once() {
    let env = env(500).await;
    let worker = Worker::register(&env.pool, "test").await.unwrap();
    let outcome = job()
        .work(&env.pool, SCOPE, &drainer(&["item-123"]), &config(50, 4), &worker)
        .await
        .unwrap();
    assert!(
        matches!(outcome, settled_engine::WorkOutcome::Drained { finished: true, .. }),
        "{outcome:?}"
    );
    worker.deregister().await;
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM jobs.items WHERE status = 'failed'").await,
        1
    );
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.items WHERE status = 'failed' AND item = 'item-123'"
        )
        .await,
        1
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.effects").await, 499);
    // Every effect carries the fence its item was settled with.
    let mismatched = count(
        &env.pool,
        "SELECT count(*) FROM jobs.effects e JOIN jobs.items i USING (day, item) WHERE e.fence <> i.attempt",
    )
    .await;
    assert_eq!(mismatched, 0);
}

/// A statement no retry can help (its table is gone: SQLSTATE 42P01, as a
/// missing grant is 42501) is the deployment's fault, not an item's: the
/// drain stops at once, says the role, and no item is failed or touched.
#[tokio::test(flavor = "multi_thread")]
async fn a_statement_the_deployment_cannot_run_stops_the_drain_at_once_and_fails_no_item() {
    let env = env(500).await;
    sqlx::query("DROP TABLE jobs.effects").execute(&env.pool).await.unwrap();
    let worker = Worker::register(&env.pool, "test").await.unwrap();
    let worked = tokio::time::timeout(
        Duration::from_secs(30),
        job().work(&env.pool, SCOPE, &drainer(&[]), &config(50, 4), &worker),
    )
    .await
    .expect("the drain ends by itself");
    worker.deregister().await;
    match worked {
        Err(EngineError::Refused {
            role, code, message, ..
        }) => {
            assert_eq!(code, "42P01");
            assert!(message.contains("jobs.effects"), "{message}");
            assert_eq!(role, "postgres");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        count(
            &env.pool,
            "SELECT count(*) FROM jobs.items WHERE status = 'eligible' AND attempt = 0"
        )
        .await,
        500
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn one_finisher_among_sixteen_racers() {
    let env = env(200).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    sqlx::query("UPDATE jobs.items SET status = 'settled'")
        .execute(&env.pool)
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let racers: Vec<_> = (0..16)
        .map(|_| {
            let (pool, barrier) = (env.pool.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                job()
                    .finish_if_drained(&pool, run.id, SCOPE, uuid::Uuid::new_v4())
                    .await
            })
        })
        .collect();
    let mut finished = 0;
    for racer in racers {
        if racer.await.unwrap().expect("no racer fails") {
            finished += 1;
        }
    }
    assert_eq!(finished, 1);
    let run = job().find_run(&env.pool, SCOPE).await.unwrap().unwrap();
    assert_eq!(run.state, RunState::Finished);
    assert_eq!(run.report.unwrap()["counts"]["settled"], 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_gives_back_leases_stops_claims_and_resume_restarts_them() {
    let env = env(50).await;
    let run = job().start_or_join(&env.pool, SCOPE, None).await.unwrap().run;
    let queue = job().queue().clone();
    let mut conn = env.pool.acquire().await.unwrap();
    let leased = queue
        .claim_leased(
            &mut conn,
            SCOPE,
            20,
            run.id,
            uuid::Uuid::new_v4(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(
        job().cancel(&env.pool, SCOPE).await.unwrap(),
        Cancelled::Now { released: 20 }
    );
    assert_eq!(
        job().cancel(&env.pool, SCOPE).await.unwrap(),
        Cancelled::NotRunning(Some(RunState::Cancelled))
    );
    let mut tx = env.pool.begin().await.unwrap();
    assert!(queue
        .claim_chunk_in_tx(&mut tx, SCOPE, 50, run.id)
        .await
        .unwrap()
        .is_empty());
    // The old holder of a released lease is refused by its fence.
    assert!(queue.complete_fenced(&mut tx, SCOPE, &leased).await.unwrap().is_empty());
    tx.rollback().await.unwrap();
    assert!(job().resume(&env.pool, SCOPE).await.unwrap());
    let mut tx = env.pool.begin().await.unwrap();
    assert_eq!(
        queue.claim_chunk_in_tx(&mut tx, SCOPE, 50, run.id).await.unwrap().len(),
        50
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_keeps_the_attempt_monotonic_and_reopens_the_run() {
    let env = env(20).await;
    let worker = Worker::register(&env.pool, "test").await.unwrap();
    job()
        .work(&env.pool, SCOPE, &drainer(&["item-7"]), &config(10, 1), &worker)
        .await
        .unwrap();
    let failed_attempt = count(
        &env.pool,
        "SELECT attempt::bigint FROM jobs.items WHERE item = 'item-7'",
    )
    .await;
    assert!(failed_attempt >= 1);
    assert_eq!(job().retry_failed(&env.pool, SCOPE, Some("item-7")).await.unwrap(), 1);
    assert_eq!(
        job().find_run(&env.pool, SCOPE).await.unwrap().unwrap().state,
        RunState::Running
    );
    let (attempt, base) =
        sqlx::query_as::<_, (i32, i32)>("SELECT attempt, attempt_base FROM jobs.items WHERE item = 'item-7'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!((i64::from(attempt), i64::from(base)), (failed_attempt, failed_attempt));
    job()
        .work(&env.pool, SCOPE, &drainer(&[]), &config(10, 1), &worker)
        .await
        .unwrap();
    worker.deregister().await;
    let settled_attempt = count(
        &env.pool,
        "SELECT attempt::bigint FROM jobs.items WHERE item = 'item-7' AND status = 'settled'",
    )
    .await;
    assert!(
        settled_attempt > failed_attempt,
        "{settled_attempt} after {failed_attempt}"
    );
    assert_eq!(
        job().find_run(&env.pool, SCOPE).await.unwrap().unwrap().state,
        RunState::Finished
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_daemons_make_one_run_per_due_time_and_settle_it_once() {
    let env = env(0).await;
    let today: String = sqlx::query_scalar("SELECT (now() AT TIME ZONE 'UTC')::date::text")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    add_items(&env.pool, &today, 2_000).await;
    let mut daemons = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..10 {
        let worker = Arc::new(Worker::register(&env.pool, "test").await.unwrap());
        workers.push(worker.clone());
        let pool = env.pool.clone();
        daemons.push(tokio::spawn(async move {
            let daemon = DaemonConfig {
                schedule: Schedule::parse("0 * * * * *", "UTC").unwrap(),
                catch_up_days: 1,
                max_poll: Duration::from_millis(300),
                max_outage: Duration::from_secs(60),
                notifications: Some(pool.clone()),
            };
            settled_engine::daemon::run(&job(), &pool, &drainer(&[]), &config(20, 2), &worker, &daemon).await
        }));
    }
    for _ in 0..600 {
        let run = job().find_run(&env.pool, &today).await.unwrap();
        if run.is_some_and(|r| r.state == RunState::Finished) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for worker in &workers {
        worker.request_stop();
    }
    for daemon in daemons {
        daemon.await.unwrap().unwrap();
    }
    assert_eq!(count(&env.pool, "SELECT count(*) FROM settled_engine.runs").await, 1);
    assert_eq!(
        job().find_run(&env.pool, &today).await.unwrap().unwrap().state,
        RunState::Finished
    );
    assert_eq!(count(&env.pool, "SELECT count(*) FROM jobs.effects").await, 2_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_work_table_missing_columns_and_indexes_is_named_at_start() {
    let env = env(0).await;
    sqlx::query("CREATE TABLE jobs.bare (day date, item text, status text)")
        .execute(&env.pool)
        .await
        .unwrap();
    let bare = Job::new(
        WorkQueue::new(QueueSpec {
            job: "bare".into(),
            table: "jobs.bare".into(),
            scope_column: "day".into(),
            scope_type: "date".into(),
            key_column: "item".into(),
            key_type: "text".into(),
        })
        .unwrap(),
        NoHooks,
    );
    let err = bare.check_work_table(&env.pool).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, EngineError::WorkTable { .. }), "{text}");
    for missing in [
        "attempt_base",
        "lease_until",
        "a unique index on (day, item)",
        "WHERE status = 'eligible'",
        "an index on (item) WHERE status = 'held'",
    ] {
        assert!(text.contains(missing), "{missing} not named in: {text}");
    }
    job().check_work_table(&env.pool).await.unwrap();
}

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
                    "child_drains_the_scope",
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

/// A handler whose chunks are one statement ([`settled_engine::raw::ChunkSql`]):
/// effects in `jobs.sql_effects` (a CHECK refuses `item-77`), holds from
/// `jobs.holds`. Its `handle_chunk` fails everything.
struct InSql;

const SQL_TABLES: &[&str] = &[
    "CREATE TABLE jobs.sql_effects (day date NOT NULL, item text NOT NULL CHECK (item <> 'item-77'),
        fence integer NOT NULL, run bigint NOT NULL, PRIMARY KEY (day, item))",
    "CREATE TABLE jobs.holds (item text PRIMARY KEY)",
];

impl ChunkHandler for InSql {
    /// Never called when the handler has a chunk statement: if the engine
    /// called it, every item would fail and the test with it.
    async fn handle_chunk(&self, _tx: &mut PgConnection, _chunk: &Chunk) -> Result<Handled, HandlerError> {
        Err(HandlerError::Permanent(
            "handle_chunk called for a handler with a chunk statement".into(),
        ))
    }

    fn chunk_sql(&self) -> Option<settled_engine::raw::ChunkSql> {
        Some(settled_engine::raw::ChunkSql {
            effects: "effects AS (
                INSERT INTO jobs.sql_effects (day, item, fence, run)
                SELECT s.day, s.item, s.attempt, r.id FROM settled s CROSS JOIN run r
                RETURNING item)"
                .into(),
            held: Some("SELECT h.item AS key FROM jobs.holds h WHERE h.item IN (SELECT item FROM picked)".into()),
        })
    }
}

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
    let settled = |s: &settled_engine::raw::DrainStats| s.items_settled.load(std::sync::atomic::Ordering::Relaxed);
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
        _item: &settled_engine::raw::ClaimedItem,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }

    async fn commit(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO jobs.effects SELECT $1::date, k, f FROM unnest($2::text[], $3::int[]) AS x(k, f)")
            .bind(&chunk.scope)
            .bind(chunk.keys())
            .bind(chunk.fences())
            .execute(tx)
            .await?;
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
            ttl: Duration::from_millis(600),
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
    let on_relation = |statements: settled_engine::raw::ChunkStatements| statements.on_scope_relation();
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
    let load = |get: fn(&settled_engine::raw::DrainStats) -> &std::sync::atomic::AtomicU64| {
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
