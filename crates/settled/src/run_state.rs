//! A run's state as operators read it (the runs page, a run's page,
//! `settled runs`): the stored state, or `stalled` for a running run that no
//! live worker serves, by the rule of the `SettledNoLiveWorker` alert (no
//! registered worker with a heartbeat within `WORKER_DEAD_AFTER_SECS`).
//! Derived when read, never written: the run row keeps `running`, and a
//! worker that starts again resumes it.

use chrono::{DateTime, Utc};
use settled_engine::raw::workers::WorkerTotals;
use settled_engine::{Run, RunState};

/// What a run is shown as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shown {
    /// Its stored state (a running run with a live worker among them).
    Stored(RunState),
    /// Running, but no worker is alive since `since`: nothing advances it.
    Stalled {
        /// When the last worker stopped counting as alive (or the run's
        /// start, if none was alive after it).
        since: DateTime<Utc>,
    },
}

impl Shown {
    /// What `run` is shown as, given the registry's `workers`.
    pub(crate) fn of(run: &Run, workers: &WorkerTotals) -> Shown {
        if run.state != RunState::Running || workers.alive > 0 {
            return Shown::Stored(run.state);
        }
        let since = workers
            .alive_until
            .map_or(run.started_at, |until| until.max(run.started_at));
        Shown::Stalled { since }
    }

    /// Its name: the stored state's, or `stalled`.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Shown::Stored(state) => state.as_str(),
            Shown::Stalled { .. } => "stalled",
        }
    }

    /// Since when it is stalled (None: it is not).
    pub(crate) fn stalled_since(&self) -> Option<DateTime<Utc>> {
        match self {
            Shown::Stalled { since } => Some(*since),
            Shown::Stored(_) => None,
        }
    }

    /// For people: `running`, `stalled since 2026-12-06 05:02:11 UTC`...
    pub(crate) fn label(&self) -> String {
        match self {
            Shown::Stored(state) => state.as_str().to_string(),
            Shown::Stalled { since } => format!("stalled since {} UTC", since.format("%Y-%m-%d %H:%M:%S")),
        }
    }
}

/// The worker registry's liveness, read once for every run shown.
pub(crate) async fn workers(pool: &sqlx::PgPool) -> Result<WorkerTotals, settled_engine::EngineError> {
    settled_engine::raw::workers::totals(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: RunState, started_at: DateTime<Utc>) -> Run {
        Run {
            id: 1,
            job: "settlement".into(),
            scope: "2026-11-28".into(),
            state,
            started_by: None,
            started_at,
            finished_at: None,
            report: None,
        }
    }

    #[test]
    fn only_a_running_run_without_a_live_worker_is_stalled_since_its_last_worker_or_its_start() {
        let start = DateTime::parse_from_rfc3339("2026-12-06T05:00:00Z").unwrap().to_utc();
        let later = start + chrono::Duration::seconds(61);
        let alive = WorkerTotals {
            alive: 1,
            alive_until: Some(later),
            ..WorkerTotals::default()
        };
        let none = |until| WorkerTotals {
            alive: 0,
            alive_until: until,
            ..WorkerTotals::default()
        };
        let running = run(RunState::Running, start);
        assert_eq!(Shown::of(&running, &alive), Shown::Stored(RunState::Running));
        assert_eq!(Shown::of(&running, &none(Some(later))), Shown::Stalled { since: later });
        let before = start - chrono::Duration::hours(1);
        assert_eq!(
            Shown::of(&running, &none(Some(before))),
            Shown::Stalled { since: start }
        );
        assert_eq!(Shown::of(&running, &none(None)), Shown::Stalled { since: start });
        let finished = run(RunState::Finished, start);
        assert_eq!(Shown::of(&finished, &none(None)), Shown::Stored(RunState::Finished));
        assert_eq!(Shown::of(&running, &none(None)).as_str(), "stalled");
    }
}
