//! `settled lab harness-adapter` driven the way the public job-queue
//! benchmark's runner drives an adapter: its environment, `ENQUEUE n`
//! lines on stdin, JSONL read from stdout, then SIGTERM. In both modes.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{wait_bounded, Env, SETTLED};

const TOKENS: u64 = 20;
const JOBS_PER_TOKEN: u64 = 10;

/// Reads stdout lines on a thread until the process closes it.
fn lines_of(stdout: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

async fn drive(mode: &str) {
    let env = Env::unmigrated().await;
    let mut child = Command::new(SETTLED)
        .args(["lab", "harness-adapter", "--mode", mode])
        .env("DATABASE_URL", &env.db.url)
        .env("SCENARIO", "long_horizon")
        .env("PRODUCER_MODE", "fixed")
        .env("PRODUCER_PACING", "harness")
        .env("PRODUCER_RATE", "200")
        .env("WORKER_COUNT", "4")
        .env("JOB_WORK_MS", "1")
        .env("SAMPLE_EVERY_S", "1")
        .env("SETTLED_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    let descriptor: serde_json::Value =
        serde_json::from_str(&lines.recv_timeout(Duration::from_secs(60)).unwrap()).unwrap();
    assert_eq!(descriptor["kind"], "descriptor", "{descriptor}");
    let system = descriptor["system"].as_str().unwrap().to_string();
    assert_eq!(system, if mode == "tx" { "settled" } else { "settled-leased" });
    assert_eq!(descriptor["event_tables"], serde_json::json!(["settled_harness.jobs"]));
    assert!(
        env.db.url.contains(descriptor["db_name"].as_str().unwrap()),
        "{descriptor}"
    );
    let mut stdin = child.stdin.take().unwrap();
    for _ in 0..TOKENS {
        stdin
            .write_all(format!("ENQUEUE {JOBS_PER_TOKEN}\n").as_bytes())
            .unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = (TOKENS * JOBS_PER_TOKEN) as i64;
    common::wait_until(60, "every enqueued job settled", || async {
        env.scalar_i64("SELECT count(*) FROM settled_harness.jobs WHERE status = 'settled'")
            .await
            == all
    })
    .await;
    // Two more ticks, so a sample sees the queue empty.
    std::thread::sleep(Duration::from_millis(2_500));
    let asked = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_bounded(&mut child, 10);
    assert!(status.success(), "exit on SIGTERM: {status}");
    eprintln!("{mode}: exited {:?} after SIGTERM", asked.elapsed());
    let records: Vec<serde_json::Value> = lines
        .try_iter()
        .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    let started = descriptor["started_at"].as_str().unwrap().to_string();
    check_samples(&system, &records, all as f64, &started);
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settled_harness.jobs").await, all);
}

/// Every record is a metric sample of this system; every required metric
/// is there; the rates, over their windows, add up to the jobs enqueued and
/// settled; the last depth is 0.
fn check_samples(system: &str, records: &[serde_json::Value], jobs: f64, started: &str) {
    let mut metrics = BTreeSet::new();
    for r in records {
        assert_eq!(r["kind"], "adapter", "{r}");
        assert_eq!(r["subject_kind"], "adapter", "{r}");
        assert_eq!(r["system"], system, "{r}");
        assert!(r["t"].as_str().unwrap().ends_with('Z'), "{r}");
        assert!(r["value"].as_f64().unwrap() >= 0.0, "{r}");
        metrics.insert(r["metric"].as_str().unwrap().to_string());
    }
    for m in [
        "claim_p50_ms",
        "claim_p95_ms",
        "claim_p99_ms",
        "enqueue_rate",
        "completion_rate",
        "queue_depth",
    ] {
        assert!(metrics.contains(m), "no {m} in {metrics:?}");
    }
    let values = |m: &str| -> Vec<f64> {
        records
            .iter()
            .filter(|r| r["metric"] == m)
            .map(|r| r["value"].as_f64().unwrap())
            .collect()
    };
    let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap();
    for rate in ["enqueue_rate", "completion_rate"] {
        // Each rate covers the time since the sample before (the first:
        // since the start): over their spans they add up to the jobs.
        let mut since = at(started);
        let mut total = 0.0;
        for r in records.iter().filter(|r| r["metric"] == rate) {
            let t = at(r["t"].as_str().unwrap());
            total += r["value"].as_f64().unwrap() * (t - since).num_microseconds().unwrap() as f64 / 1e6;
            since = t;
        }
        assert!(
            (0.8 * jobs..=1.2 * jobs).contains(&total),
            "{rate} adds up to {total} jobs, not {jobs}: {:?}",
            values(rate)
        );
    }
    assert_eq!(values("queue_depth").last().copied(), Some(0.0));
    for (p50, p99) in values("claim_p50_ms").iter().zip(values("claim_p99_ms")) {
        assert!(p99 >= *p50, "p50 {p50} p99 {p99}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_adapter_speaks_the_runners_contract_in_tx_mode() {
    drive("tx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_adapter_speaks_the_runners_contract_in_leased_mode() {
    drive("leased").await;
}

/// A child process that a failing test does not leave behind.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Jobs in the queue's table, and those settled.
async fn job_counts(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE status = 'settled') FROM settled_harness.jobs")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// The adapter rides out a PostgreSQL restart under it, as the runner's
/// chaos cell restarts it: the claim loops and the producer fail, retry
/// and carry on. Jobs are enqueued and completed again after the restart
/// (in the table and in the samples' rates), and the producer says once
/// that it failed and once that it works again.
async fn ride_out_a_restart(mode: &str) {
    use sqlx::Connection;
    let (server, url) = common::own_server(&format!("adapter_restart_{mode}")).await;
    let log_path = server.pgdata().with_file_name("adapter.log");
    let mut child = Command::new(SETTLED)
        .args(["lab", "harness-adapter", "--mode", mode])
        .env("DATABASE_URL", &url)
        .env("PRODUCER_MODE", "fixed")
        .env("PRODUCER_PACING", "adapter")
        .env("PRODUCER_RATE", "200")
        .env("WORKER_COUNT", "4")
        .env("JOB_WORK_MS", "1")
        .env("SAMPLE_EVERY_S", "1")
        .env("SETTLED_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    let mut child = KilledOnDrop(child);
    let descriptor = lines.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(descriptor.contains("\"descriptor\""), "{descriptor}");
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut counts = (0, 0);
    for _ in 0..600 {
        counts = job_counts(&mut conn).await;
        if counts.1 >= 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counts.1 >= 200, "{mode}: the adapter did not get going: {counts:?}");
    drop(conn);

    tokio::task::block_in_place(|| server.restart()).unwrap();
    let back = chrono::Utc::now();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let at_restart = job_counts(&mut conn).await;
    // 200 jobs/s: two seconds' worth of jobs enqueued and settled after it.
    let mut now = at_restart;
    for _ in 0..1200 {
        now = job_counts(&mut conn).await;
        if now.0 >= at_restart.0 + 400 && now.1 >= at_restart.1 + 400 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        now.0 >= at_restart.0 + 400 && now.1 >= at_restart.1 + 400,
        "{mode}: (enqueued, settled) {at_restart:?} when the server was back, {now:?} 60 s later"
    );
    // Two more ticks, so the samples cover the time after the restart.
    std::thread::sleep(Duration::from_millis(2_500));
    common::stop(&mut child.0);
    let records: Vec<serde_json::Value> = lines.try_iter().map(|l| serde_json::from_str(&l).unwrap()).collect();
    for rate in ["enqueue_rate", "completion_rate"] {
        let after: Vec<f64> = records
            .iter()
            .filter(|r| r["metric"] == rate)
            .filter(|r| chrono::DateTime::parse_from_rfc3339(r["t"].as_str().unwrap()).unwrap() > back)
            .map(|r| r["value"].as_f64().unwrap())
            .collect();
        assert!(
            after.iter().filter(|v| **v > 0.0).count() >= 2,
            "{mode}: {rate} after the restart: {after:?}"
        );
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    let said = |message: &str| log.lines().filter(|l| l.contains(message)).count();
    assert_eq!(said("the producer failed; retrying with backoff"), 1, "{mode}:\n{log}");
    assert_eq!(said("the producer works again"), 1, "{mode}:\n{log}");
    drop(conn);
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_adapter_enqueues_and_completes_again_after_a_postgres_restart_in_tx_mode() {
    ride_out_a_restart("tx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_adapter_enqueues_and_completes_again_after_a_postgres_restart_in_leased_mode() {
    ride_out_a_restart("leased").await;
}
