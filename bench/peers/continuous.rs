//! What the Rust peers' `continuous` binaries share (see README.md),
//! included by each with `#[path]`: the case in the environment, the stdin
//! protocol (GO, ENQUEUE n, STOP), the two producers, and the job's work:
//! take the start time, sleep, write one row into bench.effects (which has
//! no unique key, so a repeat is counted). The peer's own enqueue calls
//! come in through [`Peer`].

use std::future::Future;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The saturating producer's largest bulk enqueue.
pub const BULK_MAX: u64 = 500;

/// The case, from the environment.
pub struct Case {
    pub url: String,
    pub workers: u32,
    pub saturation: bool,
    pub depth: u64,
    pub work: Duration,
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is not set"))
}

impl Case {
    pub fn from_env() -> Case {
        Case {
            url: env("BENCH_DATABASE_URL"),
            workers: env("BENCH_WORKERS").parse().expect("BENCH_WORKERS"),
            saturation: env("BENCH_PRODUCER") == "saturation",
            depth: env("BENCH_DEPTH").parse().expect("BENCH_DEPTH"),
            work: Duration::from_millis(env("BENCH_WORK_MS").parse().expect("BENCH_WORK_MS")),
        }
    }
}

/// Jobs enqueued, and jobs whose handler started.
pub static ENQUEUED: AtomicU64 = AtomicU64::new(0);
pub static STARTED: AtomicU64 = AtomicU64::new(0);

/// Microseconds since the epoch (the host's clock, as the server's).
pub fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

/// A job's payload: its id, and when enqueue was called.
pub fn next_payload() -> (String, i64) {
    let seq = ENQUEUED.fetch_add(1, Ordering::Relaxed) + 1;
    (seq.to_string(), now_us())
}

/// The peer's own enqueue calls.
pub trait Peer: Send + Sync + 'static {
    fn one(&self, job: (String, i64)) -> impl Future<Output = Result<(), BoxError>> + Send;
    fn many(&self, jobs: Vec<(String, i64)>) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// Says `ready`, waits for GO, produces until STOP (or the end of stdin),
/// and returns once every enqueue call has returned.
pub async fn drive<P: Peer>(peer: Arc<P>, case: &Case) -> Result<(), BoxError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_string()).is_err() {
                break;
            }
        }
    });
    println!("ready");
    if rx.recv().await.as_deref() != Some("GO") {
        return Err("expected GO".into());
    }
    let stopped = Arc::new(AtomicBool::new(false));
    let saturating = {
        let (peer, stopped, saturation, depth) = (peer.clone(), stopped.clone(), case.saturation, case.depth);
        tokio::spawn(async move {
            while saturation && !stopped.load(Ordering::Relaxed) {
                let backlog = ENQUEUED.load(Ordering::Relaxed).saturating_sub(STARTED.load(Ordering::Relaxed));
                if backlog >= depth {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                let jobs = (0..(depth - backlog).min(BULK_MAX)).map(|_| next_payload()).collect();
                peer.many(jobs).await?;
            }
            Ok::<(), BoxError>(())
        })
    };
    let mut calls = tokio::task::JoinSet::new();
    while let Some(line) = rx.recv().await {
        if line == "STOP" {
            break;
        }
        let Some(n) = line.strip_prefix("ENQUEUE ").and_then(|n| n.parse::<u64>().ok()) else { continue };
        for _ in 0..n {
            let peer = peer.clone();
            calls.spawn(async move { peer.one(next_payload()).await });
        }
    }
    stopped.store(true, Ordering::Relaxed);
    saturating.await??;
    while let Some(done) = calls.join_next().await {
        done??;
    }
    Ok(())
}

/// The final line.
pub fn report(version: &str, settings: &str) {
    println!(
        "{}",
        serde_json::json!({ "version": version, "settings": settings, "enqueued": ENQUEUED.load(Ordering::Relaxed) })
    );
}
