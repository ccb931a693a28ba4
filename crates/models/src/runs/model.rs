//! The model for the checker: its initial states, actions, next states and
//! properties.

use stateright::{Model, Property};

use super::action::Action;
use super::state::{Daemon, Item, Phase, RunState, State};
use super::{property, Runs};

impl Model for Runs {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            runs: Vec::new(),
            items: vec![Item::Eligible; self.scopes as usize],
            daemons: vec![
                Daemon {
                    up: true,
                    phase: Phase::Idle
                };
                self.daemons as usize
            ],
            budget: self.faults,
            saw_serialization_failure: false,
            finished_with_work: false,
            reopened: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for d in 0..self.daemons {
            self.daemon_actions(state, d, actions);
        }
        self.operator_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::Poll { daemon } => self.poll(&mut s, daemon),
            Action::FindRun { daemon } => self.find_run(&mut s, daemon),
            Action::StartOrJoin { daemon } => self.start_or_join(&mut s, daemon),
            Action::SettleItem { daemon } | Action::FailItem { daemon } => {
                let Phase::Working(scope) = s.daemons[daemon as usize].phase else {
                    unreachable!("items are settled while working")
                };
                s.items[scope as usize] = if matches!(action, Action::FailItem { .. }) {
                    s.budget.item_failures -= 1;
                    Item::Failed
                } else {
                    Item::Settled
                };
            }
            Action::Drained { daemon } => {
                let Phase::Working(scope) = s.daemons[daemon as usize].phase else {
                    unreachable!("drained after working")
                };
                let item = s.items[scope as usize];
                let running = Self::run_of(&s, scope).is_some_and(|r| s.runs[r].state == RunState::Running);
                s.daemons[daemon as usize].phase = if item == Item::Eligible || !running {
                    Phase::Idle
                } else {
                    Phase::FinishWaiting {
                        scope,
                        seen: item,
                        stale: false,
                    }
                };
            }
            Action::FinishLock { daemon } => self.finish_lock(&mut s, daemon),
            Action::FinishCommit { daemon } => self.finish_commit(&mut s, daemon),
            Action::Cancel { scope } => {
                s.budget.cancels -= 1;
                let run = Self::run_of(&s, scope).expect("a run to cancel");
                s.runs[run].state = RunState::Cancelled;
                Self::touch(&mut s, run);
            }
            Action::Resume { scope } => {
                let run = Self::run_of(&s, scope).expect("a run to resume");
                Self::reopen(&mut s, run);
            }
            Action::Retry { scope } => self.retry(&mut s, scope),
            Action::Crash { daemon } => {
                s.budget.crashes -= 1;
                for run in &mut s.runs {
                    if run.locked_by == Some(daemon) {
                        run.locked_by = None;
                    }
                }
                s.daemons[daemon as usize] = Daemon {
                    up: false,
                    phase: Phase::Idle,
                };
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(property::ONE_RUN_PER_SCOPE, |m: &Runs, s: &State| {
                (0..m.scopes).all(|scope| s.runs.iter().filter(|r| r.scope == scope).count() <= 1)
            }),
            Property::always(property::ONE_RUNNING, |_, s: &State| {
                s.runs.iter().filter(|r| r.state == RunState::Running).count() <= 1
            }),
            Property::always(property::ONE_FINISHER, |_, s: &State| {
                s.runs.iter().all(|r| r.finishes <= 1)
            }),
            Property::always(property::OLDEST_FIRST, |_, s: &State| {
                s.runs
                    .iter()
                    .all(|r| (0..r.scope).all(|older| Runs::run_of(s, older).is_some()))
            }),
            Property::eventually(property::EVERY_SCOPE_FINISHED, |m: &Runs, s: &State| m.all_done(s)),
            Property::sometimes("a finisher meets 40001: another finished first", |_, s: &State| {
                s.saw_serialization_failure
            }),
            Property::sometimes("a run finishes while a retry gave its item back", |_, s: &State| {
                s.finished_with_work
            }),
            Property::sometimes("a daemon reopens a finished run that has work", |_, s: &State| {
                s.reopened
            }),
        ]
    }
}
