//! What operators are alerted on that no one table holds: the periods that
//! are due and not finished (from the schedule and the runs), how late the
//! oldest of them is against the run deadline, the newest finished run's
//! verification, and whether the database answers. It reads and judges;
//! it never changes a run or an item.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use settled_engine::{Run, RunState, Schedule};
use sqlx::PgPool;

use crate::cmd::worker::ScheduleFlags;
use crate::period::Period;

/// How long a scrape waits for the database to answer `SELECT 1`.
pub(crate) const DATABASE_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The default run deadline: a period is late one hour after it is due.
pub(crate) const DEFAULT_RUN_DEADLINE_SECS: u64 = 3_600;

/// The default pause between two verifications of the newest finished run.
pub(crate) const DEFAULT_VERIFY_EVERY_SECS: u64 = 3_600;

/// What `settled serve` judges runs by: the daemon's schedule and catch-up
/// window, and how long after its due time a period must be finished.
#[derive(Debug, Clone)]
pub struct Deadlines {
    /// When periods are due (the daemon's schedule).
    pub schedule: Schedule,
    /// Periods due this many days back count (the daemon's catch-up window).
    pub catch_up_days: u32,
    /// How long after it is due a period's run must be finished.
    pub deadline: Duration,
}

impl Deadlines {
    /// Deadlines from the schedule flags and a deadline in seconds.
    pub(crate) fn new(flags: &ScheduleFlags, deadline_secs: u64) -> anyhow::Result<Deadlines> {
        Ok(Deadlines {
            schedule: flags.parse()?,
            catch_up_days: flags.catch_up_days,
            deadline: Duration::from_secs(deadline_secs),
        })
    }

    /// The periods due at `now` and not finished, judged against `runs`
    /// (the job's runs, newest first; those of the catch-up window at least).
    pub(crate) fn runs_due(&self, runs: &[Run], now: DateTime<Utc>) -> RunsDue {
        let due = settled_engine::daemon::due_scopes(
            crate::settlement::job().hooks(),
            &self.schedule,
            self.catch_up_days,
            now,
        );
        runs_due(&due, runs)
    }
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines::new(&ScheduleFlags::default(), DEFAULT_RUN_DEADLINE_SECS).expect("the default schedule parses")
    }
}

/// The periods that are due and not finished, by the state of their run:
/// a due time of the schedule within the catch-up window passed (or a run
/// was started) and the run is not finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RunsDue {
    /// Due, and no run exists (no live daemon, or no input or policy yet).
    pub not_started: i64,
    /// Due, and its run is running.
    pub running: i64,
    /// Due, and its run was cancelled by an operator.
    pub cancelled: i64,
    /// When the oldest of them became due (None: none is due).
    pub oldest_due_at: Option<DateTime<Utc>>,
}

impl RunsDue {
    /// Seconds the oldest due period has waited at `now` (0: none is due).
    pub(crate) fn due_secs(&self, now: DateTime<Utc>) -> f64 {
        self.oldest_due_at
            .map(|at| (now - at).num_milliseconds().max(0) as f64 / 1000.0)
            .unwrap_or(0.0)
    }
}

/// Judges the due scopes (`due`: each with its first due time) and every
/// running run against `runs`: a scope is due until its run finishes; a
/// running run outside the due window is due from its start.
pub(crate) fn runs_due(due: &[(DateTime<Utc>, String)], runs: &[Run]) -> RunsDue {
    let mut out = RunsDue::default();
    let mut oldest = |at: DateTime<Utc>| {
        if out.oldest_due_at.is_none_or(|o| at < o) {
            out.oldest_due_at = Some(at);
        }
    };
    for (due_at, scope) in due {
        match runs.iter().find(|r| r.scope == *scope).map(|r| r.state) {
            Some(RunState::Finished) => continue,
            None => out.not_started += 1,
            Some(RunState::Running) => out.running += 1,
            Some(RunState::Cancelled) => out.cancelled += 1,
        }
        oldest(*due_at);
    }
    for run in runs.iter().filter(|r| r.state == RunState::Running) {
        if !due.iter().any(|(_, scope)| *scope == run.scope) {
            out.running += 1;
            oldest(run.started_at);
        }
    }
    out
}

/// Whether `pool` answers `SELECT 1` within [`DATABASE_PROBE_TIMEOUT`].
pub(crate) async fn database_up(pool: &PgPool) -> bool {
    let probe = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(pool);
    matches!(tokio::time::timeout(DATABASE_PROBE_TIMEOUT, probe).await, Ok(Ok(1)))
}

/// `settled_database_up` in Prometheus text.
pub(crate) fn database_up_text(up: bool) -> String {
    format!(
        "# HELP settled_database_up 1 when the database answered SELECT 1 at scrape time, else 0.\n# TYPE settled_database_up gauge\nsettled_database_up {}\n",
        u8::from(up)
    )
}

/// The newest finished run's last verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastVerification {
    /// The period verified.
    pub period: String,
    /// Every check held (false too when the verification could not run).
    pub ok: bool,
    /// Rows breaking a check (0 when it could not run).
    pub violations: i64,
}

/// Where the verifier leaves its result for `/metrics`.
pub(crate) type VerificationSlot = Arc<Mutex<Option<LastVerification>>>;

/// The verification's gauges in Prometheus text (none before the first),
/// written into the scrape rather than the recorder so that an older
/// period's series ends when a newer period is verified.
pub(crate) fn verification_text(slot: &VerificationSlot) -> String {
    let Some(last) = slot.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
        return String::new();
    };
    let period = &last.period;
    format!(
        "# HELP settled_verification_ok 1 when every check of `settled verify` held for the newest finished run, else 0.\n# TYPE settled_verification_ok gauge\nsettled_verification_ok{{period=\"{period}\"}} {}\n# HELP settled_verification_violations Rows breaking a check in that verification.\n# TYPE settled_verification_violations gauge\nsettled_verification_violations{{period=\"{period}\"}} {}\n",
        u8::from(last.ok),
        last.violations
    )
}

/// Verifies the newest finished run now and every `every`, leaving each
/// result in `slot`, until the task is dropped.
pub(crate) async fn keep_verifying(pool: PgPool, every: Duration, slot: VerificationSlot) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match verify_newest(&pool).await {
            Ok(Some(last)) => {
                if !last.ok {
                    tracing::warn!(
                        period = last.period,
                        violations = last.violations,
                        "verification FAILED: run `settled verify --period` for the offenders"
                    );
                }
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(error = %format!("{err:#}"), "could not look for the newest finished run to verify")
            }
        }
    }
}

/// Verifies the newest finished run (None: no run has finished).
async fn verify_newest(pool: &PgPool) -> anyhow::Result<Option<LastVerification>> {
    let job = crate::settlement::job();
    let runs = job.list_runs(pool, NEWEST_RUNS_LOOKED_AT).await?;
    let Some(run) = runs.into_iter().find(|r| r.state == RunState::Finished) else {
        return Ok(None);
    };
    let verified = match Period::parse(&run.scope) {
        Ok(period) => crate::verify::verify_pool(pool, period)
            .await
            .map_err(|e| format!("{e:#}")),
        Err(e) => Err(e),
    };
    Ok(Some(match verified {
        Ok(report) => LastVerification {
            period: run.scope,
            ok: report.ok,
            violations: report.checks.iter().map(|c| c.violations).sum(),
        },
        Err(err) => {
            tracing::warn!(period = run.scope, error = err, "verification could not run");
            LastVerification {
                period: run.scope,
                ok: false,
                violations: 0,
            }
        }
    }))
}

/// Runs looked at for the newest finished one (a cancelled or running run
/// may be newer).
const NEWEST_RUNS_LOOKED_AT: i64 = 32;

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn run(scope: &str, state: RunState, started: &str) -> Run {
        Run {
            id: 1,
            job: "settlement".into(),
            scope: scope.into(),
            state,
            started_by: None,
            started_at: at(started),
            finished_at: None,
            report: None,
        }
    }

    #[test]
    fn a_due_period_counts_until_its_run_finishes_and_a_started_run_from_its_start() {
        let due = vec![
            (at("2026-11-27T20:00:00Z"), "2026-11-27".to_string()),
            (at("2026-11-28T20:00:00Z"), "2026-11-28".to_string()),
        ];
        assert_eq!(
            runs_due(&due, &[]),
            RunsDue {
                not_started: 2,
                oldest_due_at: Some(at("2026-11-27T20:00:00Z")),
                ..RunsDue::default()
            }
        );
        let runs = [
            run("2026-11-28", RunState::Running, "2026-11-28T20:00:01Z"),
            run("2026-11-27", RunState::Finished, "2026-11-27T20:00:01Z"),
        ];
        let due_now = runs_due(&due, &runs);
        assert_eq!((due_now.running, due_now.not_started), (1, 0));
        assert_eq!(due_now.oldest_due_at, Some(at("2026-11-28T20:00:00Z")));
        assert_eq!(due_now.due_secs(at("2026-11-28T20:01:30Z")), 90.0);
        // An operator's run of an older period is due from its start.
        let runs = [
            run("2026-11-01", RunState::Running, "2026-11-29T08:00:00Z"),
            run("2026-11-28", RunState::Cancelled, "2026-11-28T20:00:01Z"),
            run("2026-11-27", RunState::Finished, "2026-11-27T20:00:01Z"),
        ];
        let due_now = runs_due(&due, &runs);
        assert_eq!((due_now.running, due_now.cancelled), (1, 1));
        assert_eq!(due_now.oldest_due_at, Some(at("2026-11-28T20:00:00Z")));
        let all_finished = [
            run("2026-11-28", RunState::Finished, "2026-11-28T20:00:01Z"),
            run("2026-11-27", RunState::Finished, "2026-11-27T20:00:01Z"),
        ];
        assert_eq!(runs_due(&due, &all_finished), RunsDue::default());
        assert_eq!(RunsDue::default().due_secs(at("2026-11-28T20:01:30Z")), 0.0);
    }

    #[test]
    fn the_verification_is_one_series_of_the_period_verified() {
        let slot = VerificationSlot::default();
        assert_eq!(verification_text(&slot), "");
        *slot.lock().unwrap() = Some(LastVerification {
            period: "2026-11-28".into(),
            ok: false,
            violations: 3,
        });
        let text = verification_text(&slot);
        assert!(
            text.contains("settled_verification_ok{period=\"2026-11-28\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("settled_verification_violations{period=\"2026-11-28\"} 3\n"),
            "{text}"
        );
        assert!(database_up_text(true).ends_with("settled_database_up 1\n"));
    }
}
