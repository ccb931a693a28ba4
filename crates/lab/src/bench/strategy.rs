//! One strategy case: W `settled bench-worker` processes started and
//! connected before the clock starts, lock waits sampled while they run.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::{Connection, PgConnection};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use std::collections::BTreeMap;

use super::casedb::{client_cpu, measure_case, transactions, wait_disconnected, CaseDb};
use super::{child, Strategy, CASE_TIMEOUT_SECS, READY_TIMEOUT_SECS, SAMPLE_EVERY_MS};
use super::{CaseResult, CaseSpec, Ctx};

/// Lock waits seen by the sampler.
#[derive(Debug, Default)]
pub(super) struct LockSamples {
    pub(super) samples: u64,
    pub(super) waiting_sum: u64,
    pub(super) waiting_max: u64,
    pub(super) samples_with_waiters: u64,
    pub(super) by_event: BTreeMap<String, u64>,
}

/// Lock waits now in database `name`, per wait event.
async fn lock_waits(
    conn: &mut Option<PgConnection>,
    admin_url: &str,
    name: &str,
) -> anyhow::Result<Vec<(String, i64)>> {
    if conn.is_none() {
        *conn = Some(PgConnection::connect(admin_url).await?);
    }
    let conn = conn.as_mut().expect("connected above");
    Ok(sqlx::query_as(
        "SELECT wait_event, count(*) FROM pg_stat_activity
         WHERE datname = $1 AND wait_event_type = 'Lock' GROUP BY wait_event",
    )
    .bind(name)
    .fetch_all(conn)
    .await?)
}

/// Reads `pg_stat_activity` for database `name` until `stop` is set. A
/// failed read (the server restarting) is skipped and the connection made
/// again at the next: said once when it starts failing, once when it works.
pub(super) async fn sample_locks(
    admin_url: String,
    name: String,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<LockSamples> {
    let mut conn = Some(PgConnection::connect(&admin_url).await?);
    let mut failing = false;
    let mut s = LockSamples::default();
    while !stop.load(Ordering::Relaxed) {
        let rows = match lock_waits(&mut conn, &admin_url, &name).await {
            Ok(rows) => rows,
            Err(err) => {
                conn = None;
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(error = %format!("{err:#}"), "sampling lock waits failed; retrying");
                }
                tokio::time::sleep(Duration::from_millis(SAMPLE_EVERY_MS)).await;
                continue;
            }
        };
        if std::mem::take(&mut failing) {
            tracing::info!("sampling lock waits works again");
        }
        let waiting: u64 = rows.iter().map(|(_, n)| *n as u64).sum();
        s.samples += 1;
        s.waiting_sum += waiting;
        s.waiting_max = s.waiting_max.max(waiting);
        if waiting > 0 {
            s.samples_with_waiters += 1;
        }
        for (event, n) in rows {
            *s.by_event.entry(event).or_default() += n as u64;
        }
        tokio::time::sleep(Duration::from_millis(SAMPLE_EVERY_MS)).await;
    }
    if let Some(conn) = conn {
        conn.close().await?;
    }
    Ok(s)
}

/// A started worker process, connected and waiting for `go`.
pub(super) struct ReadyChild {
    pub(super) child: tokio::process::Child,
    pub(super) stdin: tokio::process::ChildStdin,
    pub(super) stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
}

pub(super) async fn start_child(ctx: &Ctx, spec: &CaseSpec, db: &CaseDb, index: u32) -> anyhow::Result<ReadyChild> {
    let mut child = tokio::process::Command::new(&ctx.exe)
        .arg("bench-worker")
        .args(["--strategy", spec.strategy.name()])
        .args(["--period", &db.period.to_string()])
        .args(["--run", &db.run_id.to_string()])
        .args(["--chunk", &spec.chunk.to_string()])
        .args(["--work-ms", &spec.work_ms.to_string()])
        .args(["--index", &index.to_string()])
        .args(["--concurrency", &spec.concurrency.to_string()])
        .args(["--redis-url", &ctx.opts.redis_url])
        .args(["--lock-key", &format!("settled-bench:{}", db.name)])
        .env("DATABASE_URL", &db.url)
        .env(
            "SETTLED_LOG",
            std::env::var("SETTLED_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting a bench worker")?;
    let stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(READY_TIMEOUT_SECS), stdout.read_line(&mut line))
        .await
        .context("a bench worker did not get ready in time")??;
    anyhow::ensure!(
        line.trim() == "ready",
        "a bench worker did not start: {:?}",
        line.trim()
    );
    Ok(ReadyChild { child, stdin, stdout })
}

/// Sends `go` to every started worker at once and waits for all of them
/// (at most [`CASE_TIMEOUT_SECS`]; past it they are killed): the time from
/// `go` to the last exit, and each worker's report. Every worker is waited
/// for; the first failure is returned after.
pub(super) async fn go_and_wait(children: Vec<ReadyChild>) -> anyhow::Result<(Duration, Vec<child::ChildReport>)> {
    let started = Instant::now();
    let mut waits = Vec::new();
    for mut c in children {
        c.stdin.write_all(b"go\n").await?;
        c.stdin.flush().await?;
        waits.push(tokio::spawn(async move {
            let mut out = String::new();
            c.stdout.read_to_string(&mut out).await?;
            let status = c.child.wait().await?;
            let ended = Instant::now();
            drop(c.stdin);
            anyhow::ensure!(status.success(), "a bench worker failed ({status})");
            let last = out.lines().last().unwrap_or_default();
            let report: child::ChildReport =
                serde_json::from_str(last).with_context(|| format!("a bench worker's report: {last:?}"))?;
            anyhow::Ok((report, ended))
        }));
    }
    let mut reports = Vec::new();
    let mut last_exit = started;
    let mut first_error = None;
    let deadline = tokio::time::Instant::from_std(started) + Duration::from_secs(CASE_TIMEOUT_SECS);
    for i in 0..waits.len() {
        match tokio::time::timeout_at(deadline, &mut waits[i]).await {
            Ok(joined) => match joined? {
                Ok((report, ended)) => {
                    last_exit = last_exit.max(ended);
                    reports.push(report);
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            },
            Err(_) => {
                // Dropping the aborted tasks kills their processes.
                for w in &waits {
                    w.abort();
                }
                anyhow::bail!("the case did not finish within {CASE_TIMEOUT_SECS} s; its workers were killed");
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok((last_exit - started, reports)),
    }
}

pub(super) async fn run_strategy_case(ctx: &Ctx, spec: &CaseSpec) -> CaseResult {
    let mut case = CaseResult::new(
        "strategy",
        spec.strategy.name(),
        spec.workers,
        spec.work_ms,
        spec.creators,
    );
    case.chunk = Some(spec.chunk);
    case.concurrency = spec.concurrency;
    measure_case(ctx, case, async |db, case| measure_strategy(ctx, spec, db, case).await).await
}

pub(super) async fn measure_strategy(
    ctx: &Ctx,
    spec: &CaseSpec,
    db: &CaseDb,
    case: &mut CaseResult,
) -> anyhow::Result<()> {
    let cpu_before = client_cpu();
    let mut children = Vec::new();
    for index in 0..spec.workers {
        children.push(start_child(ctx, spec, db, index).await?);
    }
    let mut admin = PgConnection::connect(&ctx.admin_url).await?;
    let before = transactions(&mut admin, &db.name).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_locks(ctx.admin_url.clone(), db.name.clone(), stop.clone()));
    let waited = go_and_wait(children).await;
    case.client_cpu_seconds = Some(client_cpu() - cpu_before);
    stop.store(true, Ordering::Relaxed);
    let locks = sampler.await??;
    let (elapsed, reports) = waited?;
    wait_disconnected(&mut admin, &db.name).await?;
    let after = transactions(&mut admin, &db.name).await?;
    admin.close().await?;
    case.record_time(elapsed);
    case.transactions_per_item = Some((after - before) as f64 / spec.creators as f64);
    let latency = child::merged_latency(&reports)?;
    case.claims = Some(latency.len());
    case.claim_p50_ms = Some(latency.value_at_quantile(0.5) as f64 / 1e3);
    case.claim_p99_ms = Some(latency.value_at_quantile(0.99) as f64 / 1e3);
    case.lock_waiting_avg = Some(locks.waiting_sum as f64 / locks.samples.max(1) as f64);
    case.lock_waiting_max = Some(locks.waiting_max);
    case.lock_wait_share = Some(locks.samples_with_waiters as f64 / locks.samples.max(1) as f64);
    case.lock_wait_events = locks.by_event;
    case.peak_rss_mib = reports.iter().map(|r| r.peak_rss_kib as f64 / 1024.0).reduce(f64::max);
    let settled: u64 = reports.iter().map(|r| r.settled).sum();
    case.extra.insert("settled_by_workers".into(), settled.into());
    case.extra.insert(
        "per_worker_settled".into(),
        reports.iter().map(|r| r.settled).collect::<Vec<_>>().into(),
    );
    if matches!(spec.strategy, Strategy::RedisLock | Strategy::AdvisoryLock) {
        let waited: f64 = reports.iter().map(|r| r.lock_wait_ms).sum();
        case.extra.insert("global_lock_wait_ms_total".into(), waited.into());
    }
    if matches!(spec.strategy, Strategy::Offset | Strategy::ForUpdate) {
        let locked: u64 = reports.iter().map(|r| r.rows_locked).sum();
        case.extra.insert("rows_locked".into(), locked.into());
        case.extra.insert(
            "rows_locked_per_item".into(),
            (locked as f64 / spec.creators as f64).into(),
        );
        case.extra.insert(
            "short_claims".into(),
            reports.iter().map(|r| r.short_claims).sum::<u64>().into(),
        );
    }
    if spec.strategy == Strategy::Offset {
        case.extra.insert(
            "offset_fallbacks".into(),
            reports.iter().map(|r| r.offset_fallbacks).sum::<u64>().into(),
        );
    }
    Ok(())
}
