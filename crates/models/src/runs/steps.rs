//! The runs the model reads, the actions daemons and operators can take
//! from a state, and what each does.

use super::action::Action;
use super::state::{Item, Phase, RunRow, RunState, State};
use super::Runs;

impl Runs {
    pub(super) fn run_of(state: &State, scope: u8) -> Option<usize> {
        state.runs.iter().position(|r| r.scope == scope)
    }

    pub(super) fn running(state: &State) -> Option<usize> {
        state.runs.iter().position(|r| r.state == RunState::Running)
    }

    pub(super) fn reopen_candidate(state: &State) -> Option<usize> {
        let oldest = state
            .runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state == RunState::Finished && state.items[r.scope as usize] == Item::Eligible)
            .min_by_key(|(_, r)| r.scope)?;
        Some(oldest.0)
    }

    /// A poll would act: a run to work on (running), to reopen, or to start.
    pub(super) fn has_work(&self, state: &State) -> bool {
        Self::running(state).is_some()
            || Self::reopen_candidate(state).is_some()
            || (0..self.scopes).any(|s| Self::run_of(state, s).is_none())
    }

    /// Any update of a run row makes the snapshots that wait for it stale.
    pub(super) fn touch(state: &mut State, run: usize) {
        let scope = state.runs[run].scope;
        for d in &mut state.daemons {
            if let Phase::FinishWaiting { scope: s, stale, .. } = &mut d.phase {
                if *s == scope {
                    *stale = true;
                }
            }
        }
    }

    /// Sets run `run` running again (reopen, resume).
    pub(super) fn reopen(state: &mut State, run: usize) {
        state.runs[run].state = RunState::Running;
        state.runs[run].finishes = 0;
        Self::touch(state, run);
    }

    /// After `start_due_runs`: work on the running run, or wait.
    pub(super) fn after_starting(state: &State) -> Phase {
        match Self::running(state) {
            Some(run) => Phase::Working(state.runs[run].scope),
            None => Phase::Idle,
        }
    }

    pub(super) fn daemon_actions(&self, state: &State, d: u8, actions: &mut Vec<Action>) {
        let daemon = state.daemons[d as usize];
        if !daemon.up {
            return;
        }
        match daemon.phase {
            Phase::Idle if self.has_work(state) => actions.push(Action::Poll { daemon: d }),
            Phase::Idle => {}
            Phase::Starting(_) => actions.push(Action::FindRun { daemon: d }),
            Phase::StartTx(_) => actions.push(Action::StartOrJoin { daemon: d }),
            Phase::Working(scope) => {
                let running = Self::run_of(state, scope).is_some_and(|r| state.runs[r].state == RunState::Running);
                if running && state.items[scope as usize] == Item::Eligible {
                    actions.push(Action::SettleItem { daemon: d });
                    if state.budget.item_failures > 0 {
                        actions.push(Action::FailItem { daemon: d });
                    }
                } else {
                    actions.push(Action::Drained { daemon: d });
                }
            }
            Phase::FinishWaiting { scope, .. } => {
                let run = Self::run_of(state, scope).expect("a run to finish");
                if state.runs[run].locked_by.is_none() {
                    actions.push(Action::FinishLock { daemon: d });
                }
            }
            Phase::FinishLocked { .. } => actions.push(Action::FinishCommit { daemon: d }),
        }
        if state.budget.crashes > 0 && !self.all_done(state) {
            actions.push(Action::Crash { daemon: d });
        }
    }

    pub(super) fn operator_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (i, run) in state.runs.iter().enumerate() {
            let scope = run.scope;
            let unlocked = run.locked_by.is_none();
            let other_running = state
                .runs
                .iter()
                .enumerate()
                .any(|(j, r)| j != i && r.state == RunState::Running);
            let blocked = other_running && self.guards.one_running_per_job;
            match run.state {
                RunState::Running if unlocked && state.budget.cancels > 0 => actions.push(Action::Cancel { scope }),
                RunState::Cancelled if unlocked && !blocked => actions.push(Action::Resume { scope }),
                _ => {}
            }
            let failed = state.items[scope as usize] == Item::Failed;
            let refused = run.state == RunState::Finished && blocked;
            if failed && state.budget.retries > 0 && !refused {
                actions.push(Action::Retry { scope });
            }
        }
    }

    pub(super) fn all_done(&self, state: &State) -> bool {
        (0..self.scopes).all(|s| {
            Self::run_of(state, s).is_some_and(|r| state.runs[r].state == RunState::Finished)
                && state.items[s as usize] != Item::Eligible
        })
    }

    pub(super) fn poll(&self, s: &mut State, d: u8) {
        if let Some(run) = Self::reopen_candidate(s) {
            if Self::running(s).is_none() || !self.guards.one_running_per_job {
                Self::reopen(s, run);
                s.reopened = true;
            }
        }
        s.daemons[d as usize].phase = Phase::Starting(0);
    }

    pub(super) fn find_run(&self, s: &mut State, d: u8) {
        let Phase::Starting(n) = s.daemons[d as usize].phase else {
            unreachable!("find_run while starting")
        };
        s.daemons[d as usize].phase = if n == self.scopes {
            Self::after_starting(s)
        } else if Self::run_of(s, n).is_some() {
            Phase::Starting(n + 1)
        } else {
            Phase::StartTx(n)
        };
    }

    pub(super) fn start_or_join(&self, s: &mut State, d: u8) {
        let Phase::StartTx(scope) = s.daemons[d as usize].phase else {
            unreachable!("start_or_join after find_run")
        };
        let exists = Self::run_of(s, scope).is_some();
        let conflict = self.guards.one_running_per_job && Self::running(s).is_some();
        s.daemons[d as usize].phase = if exists {
            Phase::Starting(scope + 1)
        } else if conflict {
            // OtherRunActive: the rest wait their turn, oldest first.
            Self::after_starting(s)
        } else {
            s.runs.push(RunRow {
                scope,
                state: RunState::Running,
                locked_by: None,
                finishes: 0,
            });
            Phase::Starting(scope + 1)
        };
    }

    pub(super) fn finish_lock(&self, s: &mut State, d: u8) {
        let Phase::FinishWaiting { scope, seen, stale } = s.daemons[d as usize].phase else {
            unreachable!("the lock is waited for")
        };
        let run = Self::run_of(s, scope).expect("a run to finish");
        s.daemons[d as usize].phase = if stale {
            s.saw_serialization_failure = true;
            Phase::Idle
        } else if s.runs[run].state != RunState::Running {
            Phase::Idle
        } else {
            s.runs[run].locked_by = Some(d);
            Phase::FinishLocked { scope, seen }
        };
    }

    pub(super) fn finish_commit(&self, s: &mut State, d: u8) {
        let Phase::FinishLocked { scope, seen } = s.daemons[d as usize].phase else {
            unreachable!("the commit follows the lock")
        };
        let run = Self::run_of(s, scope).expect("a run to finish");
        s.runs[run].locked_by = None;
        if seen != Item::Eligible && s.runs[run].state == RunState::Running {
            s.runs[run].state = RunState::Finished;
            s.runs[run].finishes += 1;
            s.finished_with_work |= s.items[scope as usize] == Item::Eligible;
            Self::touch(s, run);
        }
        s.daemons[d as usize].phase = Phase::Idle;
    }

    pub(super) fn retry(&self, s: &mut State, scope: u8) {
        s.budget.retries -= 1;
        s.items[scope as usize] = Item::Eligible;
        let run = Self::run_of(s, scope).expect("retried items belong to a run");
        if s.runs[run].state == RunState::Finished {
            Self::reopen(s, run);
        }
    }
}
