//! `settled worker`: one worker process, for one period or as the daemon.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use settled_engine::daemon::DaemonConfig;
use settled_engine::{Drainer, RetryPolicy};
use settled_engine::{LeaseConfig, WorkOutcome};

use crate::cmd::{DbCommand, Outcome, DEFAULT_CHUNK, DEFAULT_CONCURRENCY, DEFAULT_LEASED_CHUNK};
use crate::db::Database;
use crate::payouts::deliver::{DeliveryFlags, DeliveryOptions, Serving};
use crate::period::Period;
use crate::worker::{Mode, WorkerOptions, WorkerOutcome};

/// Run one worker process.
///
/// With --period: join (or start) that period's run, settle until no work
/// is left, exit 0. Without it: a daemon that keeps running, creates the
/// run of the previous local day at each due time of --schedule (exactly
/// one server's insert creates it; the others join), creates missed runs of
/// the last --catch-up-days days oldest first, settles any running run,
/// and wakes on NOTIFY or polls (at most --max-poll-ms).
///
/// Start as many as you like, on as many hosts as you like, against one
/// database: they split the work without waiting for each other. SIGTERM or
/// SIGINT stops claiming; work in flight commits or is given back.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The period to settle, then exit. Without it: run as a daemon.
    #[arg(long)]
    pub period: Option<Period>,
    /// Claim loops in this process (each with its own connection), 1..=256.
    #[arg(long, env = "SETTLED_CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Creators per claim (one transaction each), 1..=10000 [default: 5000
    /// in tx mode, 100 in leased mode].
    #[arg(long, env = "SETTLED_CHUNK", value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub chunk: Option<u32>,
    /// The daemon's schedule.
    #[command(flatten)]
    pub schedule: ScheduleFlags,
    /// Serve this worker's Prometheus metrics (claim and handler latency
    /// histograms, its counters) at http://ADDR/metrics.
    #[arg(long, env = "SETTLED_METRICS_BIND")]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Longest pause between two looks when idle, in milliseconds.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub max_poll_ms: u64,
    /// How long the worker (idle daemon or claim loops) keeps going while
    /// the database is away (lost connections, a restart, a failover),
    /// retrying with backoff and logging one line per outage, before it
    /// exits with an error; seconds.
    #[arg(long, env = "SETTLED_MAX_OUTAGE_SECS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub max_outage_secs: u64,
    /// Daemon: archive (`settled archive --before TODAY-N`) settled periods
    /// older than this many days, at start and every hour. Needs the login
    /// role that owns the tables (not with --role-per-command). A period
    /// that cannot be archived yet (run unfinished, items held or failed)
    /// is logged and retried at the next hour; nothing is archived then.
    /// A COMMIT whose answer is lost is resolved as `settled archive`
    /// resolves it: the files are removed only if it did not commit.
    #[arg(long, env = "SETTLED_ARCHIVE_AFTER_DAYS", value_parser = clap::value_parser!(u32).range(1..=36_500))]
    pub archive_after_days: Option<u32>,
    /// Daemon: where --archive-after-days writes the archive files.
    #[arg(long, env = "SETTLED_ARCHIVE_DIR", default_value = "archive")]
    pub archive_dir: std::path::PathBuf,
    /// How the engine settles (mode, leases, provider).
    #[command(flatten)]
    pub engine: EngineFlags,
}

/// When periods are due: the daemon's schedule, which `settled serve` also
/// reads to tell which periods are due and how late they are.
#[derive(Debug, Clone, clap::Args)]
pub struct ScheduleFlags {
    /// Cron schedule of the daemon (5 fields, or 6 with seconds first);
    /// each due time settles the previous local day.
    #[arg(long, env = "SETTLED_SCHEDULE", default_value = DEFAULT_SCHEDULE)]
    pub schedule: String,
    /// IANA time zone of the schedule.
    #[arg(long, env = "SETTLED_TIMEZONE", default_value = DEFAULT_TIMEZONE)]
    pub timezone: String,
    /// Create runs missed while no worker was up, this many days back.
    #[arg(long, env = "SETTLED_CATCH_UP_DAYS", default_value_t = DEFAULT_CATCH_UP_DAYS,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(settled_engine::raw::MAX_CATCH_UP_DAYS)))]
    pub catch_up_days: u32,
}

/// The default schedule: 05:00 every day.
pub(crate) const DEFAULT_SCHEDULE: &str = "0 5 * * *";
/// The default time zone of the schedule.
pub(crate) const DEFAULT_TIMEZONE: &str = "Asia/Seoul";
/// The default catch-up window, in days.
pub(crate) const DEFAULT_CATCH_UP_DAYS: u32 = 3;

impl ScheduleFlags {
    /// The parsed schedule.
    pub(crate) fn parse(&self) -> anyhow::Result<settled_engine::Schedule> {
        Ok(settled_engine::Schedule::parse(&self.schedule, &self.timezone)?)
    }
}

impl Default for ScheduleFlags {
    fn default() -> ScheduleFlags {
        ScheduleFlags {
            schedule: DEFAULT_SCHEDULE.to_string(),
            timezone: DEFAULT_TIMEZONE.to_string(),
            catch_up_days: DEFAULT_CATCH_UP_DAYS,
        }
    }
}

/// How often the daemon's archiver looks for periods to archive.
pub(crate) const ARCHIVE_EVERY: Duration = Duration::from_secs(3_600);

/// The daemon's archiver: archives what is older than `days`, now and every
/// [`ARCHIVE_EVERY`], until aborted.
async fn archive_loop(pool: sqlx::PgPool, days: u32, dir: std::path::PathBuf) {
    loop {
        let before = chrono::Utc::now().date_naive() - chrono::Duration::days(i64::from(days));
        let opts = crate::archive::ArchiveOptions {
            before,
            dir: dir.clone(),
            drop_ledger: false,
            actor: Some(crate::archive::DAEMON_ACTOR.to_string()),
        };
        match crate::archive::archive(&pool, &opts).await {
            Ok(done) => {
                if done.committed_unanswered {
                    tracing::warn!("the answer to the archive's COMMIT was lost; a new connection found it committed");
                }
                for a in done.archived {
                    tracing::info!(
                        period = %a.manifest.period,
                        rows = a.manifest.rows,
                        file = %a.path.display(),
                        "period archived"
                    );
                }
            }
            Err(err) => {
                tracing::warn!(before = %before, error = %format!("{err:#}"), "archiving refused or failed; trying again in an hour")
            }
        }
        tokio::time::sleep(ARCHIVE_EVERY).await;
    }
}

/// Engine settings of commands that run workers.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineFlags {
    /// tx: claim, pay and mark settled in one transaction (ledger only).
    /// leased: claim with a lease, pay through --provider-url outside any
    /// transaction, complete with a fenced write.
    #[arg(long, env = "SETTLED_MODE", value_enum, default_value_t = Mode::Tx)]
    pub mode: Mode,
    /// The payment provider of leased mode (e.g. http://127.0.0.1:9100).
    #[arg(long, env = "SETTLED_PROVIDER_URL")]
    pub provider_url: Option<String>,
    /// Attempts before an item goes to failed.
    #[arg(long, env = "SETTLED_MAX_ATTEMPTS", default_value_t = settled_engine::raw::DEFAULT_MAX_ATTEMPTS, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: i32,
    /// First retry backoff in milliseconds (doubles per attempt, with jitter).
    #[arg(long, default_value_t = 1_000)]
    pub backoff_base_ms: u64,
    /// Longest retry backoff in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub backoff_cap_ms: u64,
    /// How this process calls the provider and holds its leases (leased
    /// mode, and the daemon's payout delivery).
    #[command(flatten)]
    pub delivery: DeliveryFlags,
}

impl EngineFlags {
    /// The daemon's payout delivery, when it has a provider.
    pub(crate) fn daemon_delivery(&self, wake: settled_engine::continuous::Wake) -> Option<DeliveryOptions> {
        let url = self.provider_url.as_deref()?;
        Some(self.delivery.options(url, &Serving::DAEMON, wake))
    }

    /// Lease timings.
    pub fn leases(&self) -> LeaseConfig {
        self.delivery.leases()
    }

    /// Retry policy.
    pub(crate) fn retry(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts,
            backoff_base_ms: self.backoff_base_ms,
            backoff_cap_ms: self.backoff_cap_ms.max(self.backoff_base_ms),
        }
    }

    /// The provider call timeout.
    pub fn provider_timeout(&self) -> Duration {
        self.delivery.provider_timeout()
    }
}

impl Args {
    /// What the worker does, from the flags.
    pub(crate) fn options(&self) -> WorkerOptions {
        WorkerOptions {
            period: self.period,
            concurrency: self.concurrency,
            chunk: self.chunk.unwrap_or(match self.engine.mode {
                Mode::Tx => DEFAULT_CHUNK,
                Mode::Leased => DEFAULT_LEASED_CHUNK,
            }),
            retry: self.engine.retry(),
            metrics_bind: self.metrics_bind,
            max_outage: Duration::from_secs(self.max_outage_secs),
        }
    }

    /// Runs the worker (one period, or the daemon) with `drainer`.
    pub async fn run_with<D: Drainer>(&self, db: &Database, drainer: &D) -> Outcome {
        let opts = self.options();
        if self.period.is_none() {
            let daemon = DaemonConfig {
                schedule: self.schedule.parse()?,
                catch_up_days: self.schedule.catch_up_days,
                max_poll: Duration::from_millis(self.max_poll_ms),
                max_outage: Duration::from_secs(self.max_outage_secs),
                notifications: db.listen_pool().await?,
            };
            let archiver = self
                .archive_after_days
                .map(|days| tokio::spawn(archive_loop(db.pool.clone(), days, self.archive_dir.clone())));
            // With a provider, the daemon delivers payouts too.
            let delivery = self.engine.daemon_delivery(db.wake().await?).map(|opts| {
                let (pool, stats) = (db.pool.clone(), Arc::new(settled_engine::ServeStats::default()));
                let handle = tokio::spawn({
                    let stats = stats.clone();
                    async move { crate::payouts::deliver::run_delivery(&pool, opts, stats).await }
                });
                (handle, stats)
            });
            let ran = crate::worker::run_daemon(&db.pool, &opts, drainer, &daemon).await;
            if let Some(archiver) = archiver {
                archiver.abort();
            }
            if let Some((handle, stats)) = delivery {
                stats.request_stop();
                if ran.is_ok() {
                    handle.await??;
                } else {
                    // The daemon gave up (on the database, say): the exit
                    // waits for nothing more; a payout in flight is resumed
                    // by the next delivery, as after a crash.
                    handle.abort();
                }
            }
            ran?;
            println!("worker daemon stopped");
            return Ok(ExitCode::SUCCESS);
        }
        let outcome = crate::worker::run_worker(&db.pool, &opts, drainer).await?;
        println!("{}; peak memory {:.1} MiB", describe(&outcome), peak_rss_mib());
        Ok(ExitCode::SUCCESS)
    }
}

/// This process's peak resident memory (VmHWM), MiB; 0 where /proc has none.
pub(crate) fn peak_rss_mib() -> f64 {
    peak_rss_kib() as f64 / 1024.0
}

/// This process's peak resident memory (VmHWM), KiB; 0 where /proc has none.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The line a worker prints when it ends.
pub(crate) fn describe(outcome: &WorkerOutcome) -> String {
    match outcome {
        WorkerOutcome::NothingToDo => "no running run; nothing to do".into(),
        WorkerOutcome::Worked(WorkOutcome::RunNotRunning(id, state)) => {
            format!("run {id} is {}; nothing to do", state.as_str())
        }
        WorkerOutcome::Worked(WorkOutcome::Drained {
            run_id,
            settled,
            finished,
        }) => format!(
            "run {run_id}: settled {settled} creators in this process; run {}",
            if *finished {
                "finished by this worker"
            } else {
                "finished or finishing"
            }
        ),
        WorkerOutcome::Worked(WorkOutcome::Stopped { run_id, settled }) => {
            format!("run {run_id}: stopped by signal after settling {settled} creators")
        }
    }
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_worker");
    const APPLICATION_NAME: &'static str = "settled-worker";
    const SINGLE_THREADED: bool = true;

    fn connections(&self) -> u32 {
        // The daemon's payout delivery, with a provider: its loops and helpers.
        let delivery = if self.period.is_none() && self.engine.provider_url.is_some() {
            6
        } else {
            0
        };
        self.concurrency + 4 + delivery
    }

    async fn run(self, db: &Database) -> Outcome {
        let e = &self.engine;
        let drainer = crate::worker::drainer(
            e.mode,
            e.provider_url.as_deref(),
            e.provider_timeout(),
            e.leases(),
            e.delivery.provider_key_window,
        )?;
        self.run_with(db, &drainer).await
    }
}
