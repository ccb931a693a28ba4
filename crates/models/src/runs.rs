//! The runs model: several daemons on the same due times, start-or-join
//! under the unique keys, catch-up oldest first, draining, the
//! one-finisher protocol (run-row lock, REPEATABLE READ, 40001), cancel and
//! resume, retry and reopen, and a daemon killed in the middle.
//!
//! It models `crates/engine/src/daemon.rs` (`step`, `start_due_runs`),
//! `job.rs` (`start_or_join`, `work`, `finish_if_drained`, `cancel`,
//! `resume`, `retry_failed`, `reopen_oldest_with_work`) and `runs.rs`
//! (the statements on `settled_engine.runs`). Items are one per scope and
//! settle in one step (their claims are the leased model's subject); every
//! scope is due from the start, as after an outage (catch-up).
//!
//! A daemon polls only when a poll would find something to do (a run to
//! start, reopen or work on): a poll that finds nothing changes nothing,
//! and leaving it out keeps every behaviour finite.

use std::fmt;

use stateright::{Model, Property};

use crate::check::Described;

/// Faults and operator actions, each at most this many times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A daemon killed (its open transaction rolls back; it stays down).
    pub crashes: u8,
    /// An item failing for good (a permanent error).
    pub item_failures: u8,
    /// `settled runs cancel` by an operator (who later resumes).
    pub cancels: u8,
    /// `settled retry` by an operator.
    pub retries: u8,
}

/// The guards a variant may go without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guards {
    /// The partial unique index `runs_one_running_per_job`.
    pub one_running_per_job: bool,
}

impl Guards {
    /// Every guard the code has.
    pub const ALL: Guards = Guards {
        one_running_per_job: true,
    };
}

/// The runs model at some bounds.
#[derive(Debug, Clone)]
pub struct Runs {
    /// Daemons (each also works on the running run).
    pub daemons: u8,
    /// Scopes due, oldest first.
    pub scopes: u8,
    /// Faults and operator actions.
    pub faults: Faults,
    /// The guards in force.
    pub guards: Guards,
}

/// `settled_engine.runs.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    /// `running`
    Running,
    /// `finished`
    Finished,
    /// `cancelled`
    Cancelled,
}

/// A row of `settled_engine.runs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunRow {
    /// `scope`
    pub scope: u8,
    /// `state`
    pub state: RunState,
    /// The daemon whose transaction holds the row lock (`FOR NO KEY UPDATE`).
    pub locked_by: Option<u8>,
    /// Ghost: finishes since the run last became `running`.
    pub finishes: u8,
}

/// An item's `status` (one item per scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Item {
    /// `eligible`
    Eligible,
    /// `settled`
    Settled,
    /// `failed`
    Failed,
}

/// Where a daemon is in its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Waiting for something to do.
    Idle,
    /// `start_due_runs`, about to look at the `n`th due scope.
    Starting(u8),
    /// `start_due_runs` found no run for the scope; `start_or_join` next.
    StartTx(u8),
    /// `Job::work` on the running run of the scope.
    Working(u8),
    /// `finish_if_drained`: the REPEATABLE READ snapshot is taken, the
    /// statement waits for the run row's lock.
    FinishWaiting {
        /// The scope.
        scope: u8,
        /// The item as the snapshot sees it.
        seen: Item,
        /// The row was updated by another transaction after the snapshot.
        stale: bool,
    },
    /// `finish_if_drained`: the run row is locked.
    FinishLocked {
        /// The scope.
        scope: u8,
        /// The item as the snapshot sees it.
        seen: Item,
    },
}

/// A daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Daemon {
    /// Alive.
    pub up: bool,
    /// Where it is.
    pub phase: Phase,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// `settled_engine.runs`, in id order.
    pub runs: Vec<RunRow>,
    /// The work table: one item per scope.
    pub items: Vec<Item>,
    /// The daemons.
    pub daemons: Vec<Daemon>,
    /// Faults left.
    pub budget: Faults,
    /// Ghost: a finisher met 40001 (another finished first).
    pub saw_serialization_failure: bool,
    /// Ghost: a run was finished while a retry had made its item eligible.
    pub finished_with_work: bool,
    /// Ghost: a daemon reopened a finished run that had work again.
    pub reopened: bool,
}

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

/// Property names.
pub mod property {
    /// Safety: the unique key `(job, scope)`.
    pub const ONE_RUN_PER_SCOPE: &str = "at most one run per job and scope";
    /// Safety: the partial unique index.
    pub const ONE_RUNNING: &str = "at most one running run per job";
    /// Safety: one finisher.
    pub const ONE_FINISHER: &str = "each run is finished by one finisher";
    /// Safety: catch-up, oldest first.
    pub const OLDEST_FIRST: &str = "missed runs start oldest first";
    /// Liveness.
    pub const EVERY_SCOPE_FINISHED: &str = "every due scope ends with a finished run and its items final";
}

impl Runs {
    /// The bounds `cargo test` checks.
    pub fn ci() -> Runs {
        Runs {
            daemons: 3,
            scopes: 2,
            faults: Faults {
                crashes: 1,
                item_failures: 1,
                cancels: 1,
                retries: 1,
            },
            guards: Guards::ALL,
        }
    }

    /// Deeper bounds (`--deep`).
    pub fn deep() -> Runs {
        Runs {
            daemons: 3,
            scopes: 3,
            faults: Faults {
                crashes: 1,
                item_failures: 2,
                cancels: 1,
                retries: 2,
            },
            guards: Guards::ALL,
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> Runs {
        self.guards = guards;
        self
    }

    fn run_of(state: &State, scope: u8) -> Option<usize> {
        state.runs.iter().position(|r| r.scope == scope)
    }

    fn running(state: &State) -> Option<usize> {
        state.runs.iter().position(|r| r.state == RunState::Running)
    }

    fn reopen_candidate(state: &State) -> Option<usize> {
        let oldest = state
            .runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state == RunState::Finished && state.items[r.scope as usize] == Item::Eligible)
            .min_by_key(|(_, r)| r.scope)?;
        Some(oldest.0)
    }

    /// A poll would act: a run to work on (running), to reopen, or to start.
    fn has_work(&self, state: &State) -> bool {
        Self::running(state).is_some()
            || Self::reopen_candidate(state).is_some()
            || (0..self.scopes).any(|s| Self::run_of(state, s).is_none())
    }

    /// Any update of a run row makes the snapshots that wait for it stale.
    fn touch(state: &mut State, run: usize) {
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
    fn reopen(state: &mut State, run: usize) {
        state.runs[run].state = RunState::Running;
        state.runs[run].finishes = 0;
        Self::touch(state, run);
    }

    /// After `start_due_runs`: work on the running run, or wait.
    fn after_starting(state: &State) -> Phase {
        match Self::running(state) {
            Some(run) => Phase::Working(state.runs[run].scope),
            None => Phase::Idle,
        }
    }

    fn daemon_actions(&self, state: &State, d: u8, actions: &mut Vec<Action>) {
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

    fn operator_actions(&self, state: &State, actions: &mut Vec<Action>) {
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

    fn all_done(&self, state: &State) -> bool {
        (0..self.scopes).all(|s| {
            Self::run_of(state, s).is_some_and(|r| state.runs[r].state == RunState::Finished)
                && state.items[s as usize] != Item::Eligible
        })
    }

    fn poll(&self, s: &mut State, d: u8) {
        if let Some(run) = Self::reopen_candidate(s) {
            if Self::running(s).is_none() || !self.guards.one_running_per_job {
                Self::reopen(s, run);
                s.reopened = true;
            }
        }
        s.daemons[d as usize].phase = Phase::Starting(0);
    }

    fn find_run(&self, s: &mut State, d: u8) {
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

    fn start_or_join(&self, s: &mut State, d: u8) {
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

    fn finish_lock(&self, s: &mut State, d: u8) {
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

    fn finish_commit(&self, s: &mut State, d: u8) {
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

    fn retry(&self, s: &mut State, scope: u8) {
        s.budget.retries -= 1;
        s.items[scope as usize] = Item::Eligible;
        let run = Self::run_of(s, scope).expect("retried items belong to a run");
        if s.runs[run].state == RunState::Finished {
            Self::reopen(s, run);
        }
    }
}

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

impl Described for Runs {
    fn name(&self) -> String {
        let guards = if self.guards.one_running_per_job {
            ""
        } else {
            ", no runs_one_running_per_job"
        };
        let f = self.faults;
        format!(
            "runs ({} daemons, {} due scopes; {} crash, {} failed item, {} cancel, {} retry{guards})",
            self.daemons, self.scopes, f.crashes, f.item_failures, f.cancels, f.retries
        )
    }

    fn describe(&self, s: &State) -> String {
        let runs: Vec<String> = s
            .runs
            .iter()
            .map(|r| {
                let lock = r.locked_by.map_or(String::new(), |d| format!(" locked by d{d}"));
                format!("scope{} {:?}{lock}", r.scope, r.state).to_lowercase()
            })
            .collect();
        let items: Vec<String> = s.items.iter().map(|i| format!("{i:?}").to_lowercase()).collect();
        let daemons: Vec<String> = s
            .daemons
            .iter()
            .enumerate()
            .map(|(i, d)| {
                if d.up {
                    format!("d{i} {:?}", d.phase)
                } else {
                    format!("d{i} down")
                }
            })
            .collect();
        format!(
            "runs [{}] items [{}] | {}",
            runs.join(", "),
            items.join(", "),
            daemons.join(", ")
        )
    }
}
