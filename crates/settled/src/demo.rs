//! `settled demo`: seed a period, settle it with several `settled worker` OS
//! processes at once, verify, and print a summary.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::PgPool;

use crate::money::FeeBps;
use crate::period::Period;
use crate::progress::Progress;
use crate::settlement::queue;
use crate::{seed, status, verify};

/// Largest number of worker processes the demo starts.
pub(crate) const MAX_DEMO_WORKERS: u32 = 64;
/// How often, at most, the demo reads progress while workers run.
pub(crate) const DEMO_PROGRESS_POLL_MS: u64 = 1_000;
/// The demo waits this many times as long as its last progress count took
/// before the next: the exact count walks the eligible index (about 0.3 s
/// at a million while workers settle), and read every second it took a
/// quarter of a backend from the workers.
pub(crate) const DEMO_PROGRESS_COST_FACTOR: u32 = 10;

/// What the demo does.
#[derive(Debug, Clone)]
pub(crate) struct DemoOptions {
    /// Creators to seed.
    pub creators: u64,
    /// Worker processes.
    pub workers: u32,
    /// Claim loops per worker.
    pub concurrency: u32,
    /// Items per claim.
    pub chunk: u32,
    /// Seed of the synthetic data.
    pub seed: u64,
    /// The period's fee.
    pub fee: FeeBps,
    /// Which volumes to seed.
    pub volumes: seed::Volumes,
}

/// The demo's result.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct DemoSummary {
    /// The period settled.
    pub period: String,
    /// Creators in the period.
    pub creators: i64,
    /// Worker processes started.
    pub workers: u32,
    /// Total paid (base units).
    pub total_paid: String,
    /// Seconds from starting the workers to the last one exiting.
    pub settle_seconds: f64,
    /// Creators per second over that time.
    pub creators_per_second: u64,
    /// Verification result.
    pub verified: bool,
    /// Peak resident memory of the largest worker process, MiB.
    pub worker_peak_rss_mib: f64,
    /// Peak resident memory of the demo process itself, MiB.
    pub demo_peak_rss_mib: f64,
}

/// The peak memory a worker's last line reports (`...; peak memory 13.9 MiB`).
fn reported_peak_mib(out: &str) -> Option<f64> {
    out.lines()
        .rev()
        .find_map(|l| l.rsplit_once("peak memory ")?.1.strip_suffix(" MiB")?.parse().ok())
}

/// Runs the demo against `pool`; workers connect to `url`.
pub(crate) async fn demo(
    pool: &PgPool,
    url: &str,
    opts: &DemoOptions,
) -> anyhow::Result<(DemoSummary, verify::VerifyReport)> {
    anyhow::ensure!(
        (1..=MAX_DEMO_WORKERS).contains(&opts.workers),
        "--workers must be 1..={MAX_DEMO_WORKERS}"
    );
    let period = choose_period(pool).await?;
    let mut conn = pool.acquire().await?;
    if crate::settlement::job()
        .find_run(&mut *conn, &period.to_string())
        .await?
        .is_none()
    {
        eprintln!(
            "seeding {} creators for period {period} (seed {})",
            opts.creators, opts.seed
        );
        let bar = Progress::new("seed", opts.creators);
        seed::seed(
            pool,
            period,
            opts.creators,
            opts.seed,
            Some(opts.fee),
            opts.volumes,
            &bar,
        )
        .await?;
    } else {
        eprintln!("resuming the unfinished run of period {period}");
    }
    let total = status::period_status(&mut conn, period).await?.total;

    eprintln!(
        "settling with {} worker processes x {} claim loops, chunk {}",
        opts.workers, opts.concurrency, opts.chunk
    );
    let exe = std::env::current_exe().context("locating the settled binary")?;
    let started = Instant::now();
    let mut children = Vec::new();
    for _ in 0..opts.workers {
        let child = tokio::process::Command::new(&exe)
            .args(["worker", "--period", &period.to_string()])
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args(["--chunk", &opts.chunk.to_string()])
            .env("DATABASE_URL", url)
            .env(
                "SETTLED_LOG",
                std::env::var("SETTLED_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker process")?;
        children.push(child);
    }
    let bar = Progress::new("settle", total as u64);
    // Wait for every worker while a ticker reads progress: the wall time ends
    // when the last worker exits, not at the next progress tick.
    let mut waits = tokio::task::JoinSet::new();
    for mut child in children {
        waits.spawn(async move {
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                use tokio::io::AsyncReadExt;
                let _ = stdout.read_to_string(&mut out).await;
            }
            child.wait().await.map(|status| (status, reported_peak_mib(&out)))
        });
    }
    let mut worker_peak_rss_mib = 0.0f64;
    let mut next_count = tokio::time::Instant::now();
    let mut failed = None;
    loop {
        tokio::select! {
            exited = waits.join_next() => match exited {
                None => break,
                Some(exit) => {
                    let (status, peak) = exit.context("waiting for a worker")?.context("waiting for a worker")?;
                    worker_peak_rss_mib = worker_peak_rss_mib.max(peak.unwrap_or(0.0));
                    if !status.success() {
                        failed.get_or_insert(status);
                    }
                }
            },
            _ = tokio::time::sleep_until(next_count) => {
                let counting = tokio::time::Instant::now();
                let left = queue().count_unfinished(&mut conn, &period.to_string()).await?;
                bar.set((total - left).max(0) as u64);
                let wait = (counting.elapsed() * DEMO_PROGRESS_COST_FACTOR).max(Duration::from_millis(DEMO_PROGRESS_POLL_MS));
                next_count = counting + wait;
            }
        }
    }
    let elapsed = started.elapsed();
    bar.set(total as u64);
    bar.finish();
    if let Some(bad) = failed {
        anyhow::bail!("a worker process failed ({bad}); run `settled status --period {period}` to see what is left");
    }

    let report = verify::verify_pool(pool, period).await?;
    let status = status::period_status(&mut conn, period).await?;
    let secs = elapsed.as_secs_f64();
    Ok((
        DemoSummary {
            period: period.to_string(),
            creators: status.total,
            workers: opts.workers,
            total_paid: status.settled_amount,
            settle_seconds: (secs * 1000.0).round() / 1000.0,
            creators_per_second: (status.total as f64 / secs.max(1e-9)) as u64,
            verified: report.ok,
            worker_peak_rss_mib,
            demo_peak_rss_mib: crate::cmd::worker::peak_rss_mib(),
        },
        report,
    ))
}

/// The job's unfinished run, if any (a demo that was interrupted resumes it);
/// otherwise the day before the earliest seeded period (or yesterday), so
/// every demo settles a fresh period and balances grow across demos.
async fn choose_period(pool: &PgPool) -> anyhow::Result<Period> {
    let mut conn = pool.acquire().await?;
    if let Some(run) = crate::settlement::job().running_run(&mut *conn).await? {
        return Period::parse(&run.scope).map_err(anyhow::Error::msg);
    }
    let date: chrono::NaiveDate =
        sqlx::query_scalar("SELECT coalesce(min(period) - 1, current_date - 1) FROM settlement.token_trade_volume")
            .fetch_one(&mut *conn)
            .await?;
    Ok(Period::from_date(date))
}

impl DemoSummary {
    /// The human rendering.
    pub(crate) fn render(&self) -> String {
        format!(
            "\nsettled demo summary\n\
             \x20 period               {}\n\
             \x20 creators             {}\n\
             \x20 worker processes     {}\n\
             \x20 total paid           {} tokens ({} base units)\n\
             \x20 wall time (settle)   {:.3} s\n\
             \x20 creators per second  {}\n\
             \x20 peak memory          {:.1} MiB per worker process (largest), {:.1} MiB this process\n\
             \x20 verification         {}\n",
            self.period,
            crate::money::grouped(&self.creators.to_string()),
            self.workers,
            crate::money::tokens(&self.total_paid, crate::money::DEFAULT_DECIMALS),
            self.total_paid,
            self.settle_seconds,
            crate::money::grouped(&self.creators_per_second.to_string()),
            self.worker_peak_rss_mib,
            self.demo_peak_rss_mib,
            if self.verified {
                "OK: every creator paid exactly once, ledger = expected = balances"
            } else {
                "FAILED"
            }
        )
    }
}
