//! One benchmark worker process (`settled bench-worker`, hidden): connects,
//! says `ready`, waits for `go` on stdin, settles with its strategy, and
//! prints one JSON line with what it measured.
//!
//! The SKIP LOCKED strategies and the two global locks run the product's own
//! path (`worker::run_worker`, the same code as `settled worker`); only
//! `for-update` and `offset` have claim loops of their own, because their
//! claim statements are exactly what the product refuses to send.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use settled_engine::{Chunk, ChunkHandler, Fence, LeaseConfig, WorkOutcome};
use settled_engine::{ClaimedItem, RetryPolicy};
use sqlx::PgPool;

use super::Strategy;
use crate::histogram_recorder::OneHistogram;
use settled::cmd::worker::peak_rss_kib;
use settled::period::Period;
use settled::settlement::{self, SettleRewards};
use settled::worker::{self, Mode, WorkerOptions, WorkerOutcome};

/// The advisory lock key every `advisory-lock` worker takes.
pub const ADVISORY_LOCK_KEY: i64 = 0x05e7_71ed;
/// The Redis lock's expiry: longer than any benchmark case, so it never
/// lapses while held (a real deployment would also have to renew it).
pub const REDIS_LOCK_PX_MS: u64 = 3_600_000;
/// Pause between two tries of a taken Redis lock.
pub const REDIS_RETRY_MS: u64 = 10;
/// Largest claim latency recorded, in microseconds (longer ones are clamped).
pub const MAX_LATENCY_US: u64 = 600_000_000;

/// What one worker process is told to do (the flags of the hidden
/// `settled bench-worker`, which `settled bench` passes).
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// The strategy this worker runs.
    #[arg(long, value_enum)]
    pub strategy: Strategy,
    /// The period it settles.
    #[arg(long)]
    pub period: Period,
    /// The run it works for (global-lock and key-range strategies).
    #[arg(long = "run")]
    pub run_id: i64,
    /// Creators per claim.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub chunk: u32,
    /// Simulated work per creator, ms.
    #[arg(long, default_value_t = 0)]
    pub work_ms: u64,
    /// This worker's index among the case's workers (0-based).
    #[arg(long, default_value_t = 0)]
    pub index: u32,
    /// Claim loops of this process.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Where the Redis-lock strategy finds Redis.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// The Redis key of this case's lock.
    #[arg(long, default_value = "settled-bench:lock")]
    pub lock_key: String,
}

/// What one worker process measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ChildReport {
    /// Items this process settled.
    pub settled: u64,
    /// Claim statements sent.
    pub claims: u64,
    /// Claim latencies in microseconds, as (value, count) pairs of an HDR histogram.
    pub latency_us: Vec<(u64, u64)>,
    /// Peak resident set size of this process (VmHWM), KiB.
    pub peak_rss_kib: u64,
    /// Time spent waiting for a global lock (redis-lock, advisory-lock), ms.
    pub lock_wait_ms: f64,
    /// Rows the claims locked (offset: the skipped rows too).
    pub rows_locked: u64,
    /// Claims that returned fewer rows than asked while work remained.
    pub short_claims: u64,
    /// Offset claims that found nothing at their offset and fell back to 0.
    pub offset_fallbacks: u64,
}

/// A claim-latency histogram in microseconds.
pub type Latency = Arc<Mutex<hdrhistogram::Histogram<u64>>>;

/// A claim-latency histogram in microseconds (1 µs .. 10 min, 3 significant digits).
pub fn new_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// The claim latencies of several workers' reports in one histogram.
pub fn merged_latency(reports: &[ChildReport]) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    let mut latency = new_histogram();
    for r in reports {
        for &(value, count) in &r.latency_us {
            latency.record_n(value, count)?;
        }
    }
    Ok(latency)
}

/// A new shared latency histogram.
pub fn new_latency() -> Latency {
    Arc::new(Mutex::new(new_histogram()))
}

fn record(latency: &Latency, elapsed: Duration) {
    let us = (elapsed.as_micros() as u64).clamp(1, MAX_LATENCY_US);
    latency.lock().expect("latency lock").saturating_record(us);
}

/// Runs one benchmark worker against `url`.
pub async fn run_child(url: &str, args: ChildArgs) -> anyhow::Result<ChildReport> {
    let latency = new_latency();
    // The product's own claim timing, without changing the product.
    let claims = latency.clone();
    OneHistogram::new(settled_engine::raw::telemetry::CLAIM_DURATION, move |secs| {
        record(&claims, Duration::from_secs_f64(secs.max(0.0)))
    })
    .install()?;
    let db = settled::db::Database::open_url(url, args.concurrency + 4, "settled-bench-worker").await?;
    let pool = db.pool.clone();
    let mut redis = None;
    if args.strategy == Strategy::RedisLock {
        let client = redis::Client::open(args.redis_url.as_str()).context("the Redis URL")?;
        redis = Some(
            client
                .get_multiplexed_async_connection()
                .await
                .context("connecting to Redis")?,
        );
    }
    // Everyone connected: wait for the starting signal, so the clock measures
    // settling, not process start-up.
    println!("ready");
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await??;
    anyhow::ensure!(line.trim() == "go", "expected `go` on stdin, got {:?}", line.trim());

    let mut report = ChildReport::default();
    match args.strategy {
        Strategy::SkipLockedChunk => report.settled = engine_drain(&pool, &args, Mode::Tx, args.chunk).await?,
        Strategy::SkipLockedItem => report.settled = engine_drain(&pool, &args, Mode::Tx, 1).await?,
        Strategy::SkipLockedLeased => report.settled = engine_drain(&pool, &args, Mode::Leased, args.chunk).await?,
        Strategy::AdvisoryLock => {
            let mut conn = pool.acquire().await?;
            let waiting = Instant::now();
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(ADVISORY_LOCK_KEY)
                .execute(&mut *conn)
                .await?;
            report.lock_wait_ms = waiting.elapsed().as_secs_f64() * 1e3;
            report.settled = engine_drain(&pool, &args, Mode::Tx, args.chunk).await?;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(ADVISORY_LOCK_KEY)
                .execute(&mut *conn)
                .await?;
        }
        Strategy::RedisLock => {
            let mut con = redis.expect("connected above");
            let token = uuid::Uuid::new_v4().to_string();
            let waiting = Instant::now();
            loop {
                let taken: Option<String> = redis::cmd("SET")
                    .arg(&args.lock_key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(REDIS_LOCK_PX_MS)
                    .query_async(&mut con)
                    .await
                    .context("SET NX PX on Redis")?;
                if taken.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(REDIS_RETRY_MS)).await;
            }
            report.lock_wait_ms = waiting.elapsed().as_secs_f64() * 1e3;
            let drained = engine_drain(&pool, &args, Mode::Tx, args.chunk).await;
            // Release only our own lock (compare and delete, atomically).
            let released: i64 = redis::Script::new(
                "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
            )
            .key(&args.lock_key)
            .arg(&token)
            .invoke_async(&mut con)
            .await
            .context("releasing the Redis lock")?;
            anyhow::ensure!(released == 1, "the Redis lock was no longer ours at release");
            report.settled = drained?;
        }
        Strategy::ForUpdate | Strategy::Offset => own_loop(&pool, &args, &latency, &mut report).await?,
    }
    report.claims = latency.lock().expect("latency lock").len();
    report.latency_us = latency
        .lock()
        .expect("latency lock")
        .iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect();
    db.close().await?;
    report.peak_rss_kib = peak_rss_kib();
    Ok(report)
}

/// The product's path: what `settled worker --period P` does, with the
/// lab's simulated work around the real handler.
async fn engine_drain(pool: &PgPool, args: &ChildArgs, mode: Mode, chunk: u32) -> anyhow::Result<u64> {
    let opts = WorkerOptions {
        period: Some(args.period),
        concurrency: args.concurrency,
        chunk,
        retry: RetryPolicy::default(),
        metrics_bind: None,
        max_outage: settled_engine::DrainConfig::default().max_outage,
    };
    let drainer = crate::simulate::drainer(
        mode,
        None,
        Duration::from_secs(10),
        LeaseConfig::default(),
        Duration::from_millis(args.work_ms),
    )?;
    match worker::run_worker(pool, &opts, &drainer).await? {
        WorkerOutcome::Worked(WorkOutcome::Drained { settled, .. }) => Ok(settled),
        WorkerOutcome::Worked(WorkOutcome::RunNotRunning(..)) => Ok(0),
        other => anyhow::bail!("the worker ended unexpectedly: {other:?}"),
    }
}

/// The engine's own claim statement (its filter and its key order) with
/// its limit and locking clause replaced: the two strategies below send
/// exactly what the engine sends, less SKIP LOCKED.
fn claim_without_skip_locked(tail: &str) -> String {
    let engine = settlement::queue().claim_in_tx_sql().to_string();
    let head = engine
        .split("LIMIT $2")
        .next()
        .expect("the engine's claim has a LIMIT")
        .to_string();
    format!("{head}{tail}")
}

/// `for-update`: every worker asks for the same first eligible rows and
/// waits for whoever holds them.
fn for_update_claim() -> String {
    claim_without_skip_locked("LIMIT $2 FOR UPDATE OF t")
}

/// `offset`: worker k pages from row k x chunk in key order. FOR UPDATE locks
/// every row the OFFSET walks over, not only the rows returned.
fn offset_claim() -> String {
    claim_without_skip_locked("OFFSET $4 LIMIT $2 FOR UPDATE OF t")
}

/// Claim, pay (the product's handler: holds lookup, ledger and balances) and
/// mark settled in one transaction, with the strategy's claim statement.
async fn own_loop(pool: &PgPool, args: &ChildArgs, latency: &Latency, report: &mut ChildReport) -> anyhow::Result<()> {
    let handler = crate::simulate::SimulatedWork {
        inner: SettleRewards,
        per_item: Duration::from_millis(args.work_ms),
    };
    let (offset_sql, for_update_sql) = (offset_claim(), for_update_claim());
    let queue = settlement::queue();
    let scope = args.period.to_string();
    let offset_mode = args.strategy == Strategy::Offset;
    let mut offset = if offset_mode {
        i64::from(args.index) * i64::from(args.chunk)
    } else {
        0
    };
    loop {
        let mut tx = pool.begin().await?;
        let started = Instant::now();
        let query = if offset_mode {
            sqlx::query_as::<_, (String, Fence)>(&offset_sql)
                .bind(&scope)
                .bind(i64::from(args.chunk))
                .bind(args.run_id)
                .bind(offset)
        } else {
            sqlx::query_as::<_, (String, Fence)>(&for_update_sql)
                .bind(&scope)
                .bind(i64::from(args.chunk))
                .bind(args.run_id)
        };
        let claimed = query.fetch_all(&mut *tx).await.context("claiming")?;
        record(latency, started.elapsed());
        if claimed.is_empty() {
            tx.rollback().await?;
            if offset > 0 {
                offset = 0;
                report.offset_fallbacks += 1;
                continue;
            }
            let mut conn = pool.acquire().await?;
            if !queue.has_unfinished(&mut conn, &scope).await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let n = claimed.len() as u64;
        report.rows_locked += n + offset as u64;
        if n < u64::from(args.chunk) {
            report.short_claims += 1;
        }
        let chunk = Chunk {
            run_id: args.run_id,
            scope: scope.clone(),
            items: claimed
                .into_iter()
                .map(|(key, fence)| ClaimedItem { key, fence })
                .collect(),
        };
        let handled = handler
            .handle_chunk(&mut tx, &chunk)
            .await
            .map_err(|e| anyhow::anyhow!("paying a chunk: {e}"))?;
        anyhow::ensure!(handled.held.is_empty(), "the benchmark has no holds");
        queue.mark_settled_in_tx(&mut tx, &scope, &chunk.keys()).await?;
        tx.commit().await?;
        report.settled += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_waiting_strategies_send_the_engines_claim_in_key_order_less_skip_locked() {
        for (sql, tail) in [
            (for_update_claim(), "ORDER BY t.creator\nLIMIT $2 FOR UPDATE OF t"),
            (offset_claim(), "ORDER BY t.creator\nOFFSET $4 LIMIT $2 FOR UPDATE OF t"),
        ] {
            let flat: String = sql.lines().map(str::trim).collect::<Vec<_>>().join("\n");
            assert_eq!(flat.matches("ORDER BY").count(), 1, "{sql}");
            assert!(flat.ends_with(tail), "{sql}");
            assert!(!flat.contains("SKIP LOCKED"), "{sql}");
        }
    }
}
