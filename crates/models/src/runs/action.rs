//! What can happen: each action names the function and the statement it
//! models.

use std::fmt;

/// What can happen. Each action names the function and statement it models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Models the top of `step` in daemon.rs: `Job::reopen_oldest_with_work`
    /// (`finished_scope_with_work`, then `runs::reopen`: `UPDATE runs SET
    /// state = 'running' WHERE job = $1 AND scope = $2 AND state =
    /// ANY('{finished}')`, refused by `runs_one_running_per_job` while
    /// another runs), then `start_due_runs`.
    Poll {
        /// The daemon.
        daemon: u8,
    },
    /// Models `Job::find_run` in `start_due_runs` (daemon.rs): `SELECT ..
    /// FROM settled_engine.runs WHERE job = $1 AND scope = $2`.
    FindRun {
        /// The daemon.
        daemon: u8,
    },
    /// Models `Job::start_or_join` (job.rs) and `runs::start_or_join`:
    /// `INSERT INTO settled_engine.runs (job, scope, started_by) .. ON
    /// CONFLICT DO NOTHING RETURNING ..`, then the existing run, or
    /// `OtherRunActive` (the loop breaks: oldest first).
    StartOrJoin {
        /// The daemon.
        daemon: u8,
    },
    /// Models a drain's chunk (executor.rs, the chunk statement): the item
    /// claimed `WHERE status = 'eligible' AND EXISTS (.. runs r WHERE r.id
    /// = $3 AND r.state = 'running')`, settled with its effect.
    SettleItem {
        /// The daemon.
        daemon: u8,
    },
    /// The same chunk failing for good: `fail_unclaimed` marks it `failed`.
    FailItem {
        /// The daemon.
        daemon: u8,
    },
    /// Models the start of `Job::finish_if_drained` (job.rs):
    /// `has_unfinished`, then `BEGIN; SET TRANSACTION ISOLATION LEVEL
    /// REPEATABLE READ` and `lock_for_finish`'s `SELECT state .. FOR NO KEY
    /// UPDATE`, which takes the snapshot and waits for the row lock.
    Drained {
        /// The daemon.
        daemon: u8,
    },
    /// Models `runs::lock_for_finish` getting the lock: SQLSTATE 40001 when
    /// the row changed after the snapshot; else the run's state.
    FinishLock {
        /// The daemon.
        daemon: u8,
    },
    /// Models the rest of `finish_if_drained`: `has_unfinished` in the
    /// snapshot, the report, `runs::finish` (`UPDATE runs SET state =
    /// 'finished' .. WHERE id = $1 AND state = 'running'`), `COMMIT`.
    FinishCommit {
        /// The daemon.
        daemon: u8,
    },
    /// Models `Job::cancel` (job.rs): `runs::cancel` (`UPDATE runs SET
    /// state = 'cancelled' .. WHERE job = $1 AND scope = $2 AND state =
    /// 'running'`) and `release_scope`, one transaction.
    Cancel {
        /// The scope.
        scope: u8,
    },
    /// Models `Job::resume` (job.rs): `runs::reopen` from `cancelled`.
    Resume {
        /// The scope.
        scope: u8,
    },
    /// Models `Job::retry_failed` (job.rs): `retry_failed` (`UPDATE .. SET
    /// status = 'eligible', attempt_base = attempt WHERE status =
    /// 'failed'`) and `runs::reopen` from `finished`, one transaction (an
    /// `OtherRunActive` from the reopen rolls it all back).
    Retry {
        /// The scope.
        scope: u8,
    },
    /// A daemon killed: its transaction rolls back, its row lock is released.
    Crash {
        /// The daemon.
        daemon: u8,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Poll { daemon } => write!(f, "d{daemon} step: reopen_oldest_with_work, start_due_runs"),
            Action::FindRun { daemon } => write!(f, "d{daemon} find_run"),
            Action::StartOrJoin { daemon } => write!(f, "d{daemon} start_or_join (INSERT .. ON CONFLICT DO NOTHING)"),
            Action::SettleItem { daemon } => write!(f, "d{daemon} drain: chunk settles the item"),
            Action::FailItem { daemon } => write!(f, "d{daemon} drain: the item fails"),
            Action::Drained { daemon } => write!(f, "d{daemon} finish_if_drained: snapshot, waits for the run row"),
            Action::FinishLock { daemon } => write!(f, "d{daemon} lock_for_finish"),
            Action::FinishCommit { daemon } => write!(f, "d{daemon} finish + COMMIT"),
            Action::Cancel { scope } => write!(f, "operator cancels scope {scope}"),
            Action::Resume { scope } => write!(f, "operator resumes scope {scope}"),
            Action::Retry { scope } => write!(f, "operator retries scope {scope}"),
            Action::Crash { daemon } => write!(f, "d{daemon} SIGKILL"),
        }
    }
}
