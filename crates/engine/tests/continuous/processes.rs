//! Four processes enqueue and serve one queue at once, two in each mode,
//! while they are SIGKILLed and SIGSTOPped past their leases; then a
//! restart of PostgreSQL under load. Every committed job ends settled with
//! exactly one effect, no rolled-back job runs, and every leased job's
//! external call carried its key (a receiver keyed by it absorbed the
//! repeats).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use settled_engine::continuous::NewJob;
use settled_testkit::{LocalOptions, LocalPostgres};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};

use crate::common::*;

/// Set for the child processes: the database URL.
const CHILD_URL: &str = "CONTINUOUS_TEST_CHILD_URL";
/// The child's mode (`tx` or `leased`) and its name (`c1`..`c4`, with an incarnation).
const CHILD_MODE: &str = "CONTINUOUS_TEST_CHILD_MODE";
const CHILD_NAME: &str = "CONTINUOUS_TEST_CHILD_NAME";
/// Jobs each incarnation enqueues, in transactions of ten.
const JOBS_PER_CHILD: usize = 300;

/// True for the transactions a child rolls back (deterministic, so the
/// parent knows which keys must never run).
fn rolled_back(tx_no: usize) -> bool {
    tx_no % 7 == 3
}

#[test]
#[ignore = "a child process of the tests in this file"]
fn child_enqueues_and_serves() {
    let Ok(url) = std::env::var(CHILD_URL) else { return };
    let mode = std::env::var(CHILD_MODE).unwrap();
    let name = std::env::var(CHILD_NAME).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = PgPoolOptions::new().max_connections(12).connect(&url).await.unwrap();
        let stats = Arc::new(settled_engine::continuous::ServeStats::default());
        // Leased work is slow enough that a paused worker holds leases.
        let script = Script {
            worker: name.clone(),
            work: Duration::from_millis(if mode == "tx" { 2 } else { 150 }),
            ..Script::default()
        };
        let mut cfg = config(3, 5);
        cfg.retry.max_attempts = 1_000;
        sqlx::query("INSERT INTO jobs.children (name, worker) VALUES ($1, $2)")
            .bind(&name)
            .bind(cfg.worker)
            .execute(&pool)
            .await
            .unwrap();
        cfg.poll = Duration::from_millis(500);
        let serving = {
            let (pool, stats) = (pool.clone(), stats.clone());
            tokio::spawn(async move {
                if mode == "tx" {
                    settled_engine::continuous::serve(&pool, queue(), TxScripted::new(script), cfg, stats).await
                } else {
                    let handler = Arc::new(LeasedScripted {
                        script,
                        pool: pool.clone(),
                    });
                    settled_engine::continuous::serve_leased(&pool, queue(), handler, cfg, stats).await
                }
            })
        };
        enqueue_own_jobs(&pool, &name).await;
        let stopper = stats.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
            term.recv().await;
            stopper.request_stop();
        });
        serving.await.unwrap().unwrap();
    });
}

/// Enqueues this incarnation's jobs in transactions of ten, rolling some
/// back, and says when done (a row in `jobs.enqueuers`). A transaction
/// that fails (the server restarting) is sent again: its keys make a
/// second commit of it a no-op.
async fn enqueue_own_jobs(pool: &PgPool, name: &str) {
    for (tx_no, keys) in (0..JOBS_PER_CHILD).collect::<Vec<_>>().chunks(10).enumerate() {
        let jobs: Vec<NewJob> = keys
            .iter()
            .map(|n| NewJob::new(format!("{name}-{tx_no}-{n}")))
            .collect();
        while let Err(err) = enqueue_once(pool, &jobs, rolled_back(tx_no)).await {
            eprintln!("{name}: enqueue failed, again: {err}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(ENQUEUE_PAUSE_MS)).await;
    }
    while sqlx::query("INSERT INTO jobs.enqueuers (name) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(name)
        .execute(pool)
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Pause between two enqueue transactions of a child: enqueueing goes on
/// for seconds, so faults land while jobs are in hand.
const ENQUEUE_PAUSE_MS: u64 = 100;

async fn enqueue_once(pool: &PgPool, jobs: &[NewJob], roll_back: bool) -> Result<(), Box<dyn std::error::Error>> {
    let q = queue();
    let mut tx = pool.begin().await?;
    for job in jobs {
        q.enqueue(&mut tx, job).await?;
    }
    if roll_back {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(())
}

fn spawn_child(url: &str, mode: &str, name: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "processes::child_enqueues_and_serves",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_URL, url)
        .env(CHILD_MODE, mode)
        .env(CHILD_NAME, name)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

impl Drop for Slot {
    /// A failed test leaves no child serving.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One child slot: its mode, its incarnations, the live process.
struct Slot {
    mode: &'static str,
    id: usize,
    incarnation: usize,
    child: Child,
}

impl Slot {
    fn name(id: usize, incarnation: usize) -> String {
        format!("c{id}i{incarnation}")
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Waits until this child holds leases (leased mode), up to `secs`;
    /// the keys of the jobs it holds whose external call it has made.
    async fn holds_leases(&self, pool: &PgPool, secs: u64) -> Option<Vec<String>> {
        let name = Slot::name(self.id, self.incarnation);
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            let held: Vec<(String, bool)> = sqlx::query_as(
                "SELECT q.key, r.key IS NOT NULL FROM jobs.queue q
                 JOIN jobs.children c ON c.worker = q.lease_owner
                 LEFT JOIN jobs.receiver r ON r.key = q.key
                 WHERE c.name = $1 AND q.status = 'processing'",
            )
            .bind(&name)
            .fetch_all(pool)
            .await
            .unwrap();
            if !held.is_empty() {
                return Some(held.into_iter().filter(|(_, called)| *called).map(|(k, _)| k).collect());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    fn respawn(&mut self, url: &str) {
        self.incarnation += 1;
        self.child = spawn_child(url, self.mode, &Slot::name(self.id, self.incarnation));
    }
}

async fn prepare(pool: &PgPool) {
    receiver(pool).await;
    for sql in [
        "CREATE TABLE jobs.enqueuers (name text PRIMARY KEY)",
        "CREATE TABLE jobs.children (name text PRIMARY KEY, worker uuid NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
}

fn start_slots(url: &str) -> Vec<Slot> {
    ["tx", "tx", "leased", "leased"]
        .into_iter()
        .enumerate()
        .map(|(id, mode)| Slot {
            mode,
            id,
            incarnation: 0,
            child: spawn_child(url, mode, &Slot::name(id, 0)),
        })
        .collect()
}

/// Waits for every live incarnation to finish enqueueing and for the queue
/// to drain, then stops the children with SIGTERM (each must exit 0).
async fn drain_and_stop(pool: &PgPool, mut slots: Vec<Slot>) {
    let live: Vec<String> = slots.iter().map(|s| Slot::name(s.id, s.incarnation)).collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs.enqueuers WHERE name = ANY($1)")
            .bind(&live)
            .fetch_one(pool)
            .await
            .unwrap();
        let open = count(
            pool,
            "SELECT count(*) FROM jobs.queue WHERE status IN ('eligible', 'processing')",
        )
        .await;
        if done == 4 && open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drained: {done} of 4 enqueued, {open} jobs open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for slot in &slots {
        kill(slot.pid(), Signal::SIGTERM).unwrap();
    }
    for slot in &mut slots {
        let status = slot.child.wait().unwrap();
        assert!(
            status.success(),
            "{} exited with {status}",
            Slot::name(slot.id, slot.incarnation)
        );
    }
}

/// What must hold at the end, whatever happened on the way.
async fn check_exactly_once(pool: &PgPool) {
    assert_eq!(
        count(pool, "SELECT count(*) FROM jobs.queue WHERE status <> 'settled'").await,
        0,
        "every committed job settled; none failed or is left"
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM (SELECT key FROM jobs.effects GROUP BY key HAVING count(*) > 1) d"
        )
        .await,
        0,
        "no effect happened twice"
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM jobs.queue q WHERE NOT EXISTS (SELECT 1 FROM jobs.effects e WHERE e.key = q.key)"
        )
        .await,
        0,
        "no settled job lacks its effect"
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM jobs.effects e WHERE NOT EXISTS (SELECT 1 FROM jobs.queue q WHERE q.key = e.key)"
        )
        .await,
        0,
        "no effect of a job that was never committed"
    );
    let rolled: Vec<String> = (0..JOBS_PER_CHILD / 10)
        .filter(|t| rolled_back(*t))
        .map(|t| format!("-{t}-"))
        .collect();
    for marker in rolled {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs.effects WHERE strpos(key, $1) > 0")
            .bind(&marker)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(n, 0, "a job of a rolled-back enqueue ({marker}) ran");
    }
    // Every leased job's external call carried its key: the receiver saw
    // each leased job's key, and absorbed any repeat of it.
    assert_eq!(
        count(pool, "SELECT count(*) FROM jobs.effects e WHERE e.worker LIKE 'c2%' OR e.worker LIKE 'c3%'").await,
        count(pool, "SELECT count(*) FROM jobs.effects e JOIN jobs.receiver r USING (key) WHERE e.worker LIKE 'c2%' OR e.worker LIKE 'c3%'").await,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn four_processes_enqueue_and_serve_while_killed_and_paused_past_their_leases_and_each_job_runs_once() {
    let env = env().await;
    prepare(&env.pool).await;
    let url = env.db.url.clone();
    let mut slots = start_slots(&url);
    // Twelve faults, one every 700 ms, in turn: SIGKILL (and a new
    // incarnation), or SIGSTOP for three lease lengths, then SIGCONT; a
    // leased child is paused while it holds leases.
    let mut paused_holding = 0;
    // (key, the paused child) for each job a paused child held after its call.
    let mut called_then_paused: Vec<(String, String)> = Vec::new();
    for round in 0..12 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let slot = &mut slots[round % 4];
        if round % 3 == 0 {
            if slot.mode == "leased" {
                if let Some(called) = slot.holds_leases(&env.pool, 5).await {
                    paused_holding += 1;
                    let name = Slot::name(slot.id, slot.incarnation);
                    called_then_paused.extend(called.into_iter().map(|k| (k, name.clone())));
                }
            }
            kill(slot.pid(), Signal::SIGSTOP).unwrap();
            tokio::time::sleep(Duration::from_secs(6)).await;
            kill(slot.pid(), Signal::SIGCONT).unwrap();
        } else {
            kill(slot.pid(), Signal::SIGKILL).unwrap();
            slot.child.wait().unwrap();
            slot.respawn(&url);
        }
    }
    drain_and_stop(&env.pool, slots).await;
    check_exactly_once(&env.pool).await;
    let settled = count(&env.pool, "SELECT count(*) FROM jobs.queue").await;
    assert!(
        settled >= 4 * 250,
        "{settled} jobs: every incarnation that lived enqueued its jobs"
    );
    let absorbed = count(
        &env.pool,
        "SELECT coalesce(sum(calls - 1), 0)::bigint FROM jobs.receiver",
    )
    .await;
    // A job whose call a paused child had made, finished by another leased
    // child: that child called again under the job's key (the receiver
    // absorbed the repeat), and only its completion counted. (Finished by
    // the paused child itself when nobody claimed it meanwhile, or by an
    // in-transaction child, which makes no call: nothing repeated.)
    let (keys, paused): (Vec<String>, Vec<String>) = called_then_paused.iter().cloned().unzip();
    let taken_over: Vec<(String, i32)> = sqlx::query_as(
        "SELECT p.key, r.calls FROM unnest($1::text[], $2::text[]) AS p(key, paused)
         JOIN jobs.effects e ON e.key = p.key
         JOIN jobs.receiver r ON r.key = p.key
         WHERE e.worker <> p.paused AND (e.worker LIKE 'c2%' OR e.worker LIKE 'c3%')",
    )
    .bind(&keys)
    .bind(&paused)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    println!(
        "{settled} jobs settled once; {paused_holding} leased workers paused holding leases, {} of their jobs past \
         the call, {} taken over by another leased worker; the receiver absorbed {absorbed} repeated calls",
        keys.len(),
        taken_over.len()
    );
    assert!(paused_holding > 0, "no leased worker was paused while it held leases");
    for (key, calls) in &taken_over {
        assert!(
            *calls >= 2,
            "job {key}: taken over after the paused worker's call, yet called {calls} time(s)"
        );
    }
}

/// A private server of the test's own, since it is restarted.
async fn own_server() -> (LocalPostgres, String) {
    let dir = tempfile::Builder::new()
        .prefix("settled-queue-restart-")
        .tempdir()
        .unwrap()
        .keep();
    let opts = LocalOptions {
        data_dir: dir,
        throwaway: true,
        remove_on_stop: true,
        max_connections: 100,
        settings: Vec::new(),
    };
    let server = tokio::task::spawn_blocking(move || LocalPostgres::start(&opts))
        .await
        .unwrap()
        .unwrap();
    let mut admin = sqlx::PgConnection::connect(&server.url("postgres")).await.unwrap();
    sqlx::query("CREATE DATABASE queue_restart")
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    let url = server.url("queue_restart");
    (server, url)
}

#[tokio::test(flavor = "multi_thread")]
async fn serving_processes_ride_out_a_postgres_restart_under_load() {
    let (server, url) = own_server().await;
    let pool = PgPoolOptions::new().max_connections(4).connect(&url).await.unwrap();
    settled_engine::migrate(&pool).await.unwrap();
    setup(&pool).await;
    prepare(&pool).await;
    pool.close().await;
    let slots = start_slots(&url);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let pool = PgPoolOptions::new().max_connections(4).connect(&url).await.unwrap();
    // The listeners reconnect: a job enqueued after the restart is picked
    // up with no more than the children's half-second poll.
    drain_and_stop(&pool, slots).await;
    check_exactly_once(&pool).await;
    pool.close().await;
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}
