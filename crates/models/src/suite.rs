//! The checks this crate stands for, in one place: each model at the
//! bounds `cargo test` runs and at deeper ones, and each guard's variant
//! with the property it must break. The tests and the binary both run
//! these, so the documented figures are the tested ones.

use std::fmt::{Debug, Display};
use std::hash::Hash;

use crate::check::{self, Described, Outcome};
use crate::{leased, payouts, runs};

/// Which bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bounds {
    /// What `cargo test` checks (minutes in all on two cores, debug build).
    Ci,
    /// Deeper: more workers, items, faults (`--deep`, release build).
    Deep,
}

/// What a full check of one model found.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The model and its bounds.
    pub name: String,
    /// The checker's report (figures, then each property).
    pub report: String,
    /// Distinct states.
    pub unique_states: usize,
    /// Every property held.
    pub all_held: bool,
    /// The state graph has no cycle (so `eventually` was checked on every
    /// behaviour), or the actions around a cycle.
    pub acyclic: Result<(), String>,
    /// Distinct states the cycle search met (equal to the checker's).
    pub searched_states: usize,
}

/// Checks one model in full, and searches its state graph for a cycle.
pub fn check_model<M>(model: M) -> Summary
where
    M: Described + Clone + Send + Sync + 'static,
    M::State: Debug + Clone + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Display + Debug + Clone + PartialEq + Send + Sync + 'static,
{
    let outcome = check::check(model.clone());
    let (acyclic, searched_states) = match check::find_cycle(&model) {
        Ok(states) => (Ok(()), states),
        Err(actions) => {
            let around: Vec<String> = actions.iter().map(|a| a.to_string()).collect();
            (Err(around.join("\n")), 0)
        }
    };
    Summary {
        name: outcome.name.clone(),
        report: outcome.report(),
        unique_states: outcome.unique_states,
        all_held: outcome.all_held(),
        acyclic,
        searched_states,
    }
}

/// The leased-work models at `bounds`.
pub fn leased_models(bounds: Bounds) -> Vec<leased::LeasedWork> {
    match bounds {
        Bounds::Ci => vec![
            leased::LeasedWork::ci(),
            leased::LeasedWork::ci_synchronous(),
            leased::LeasedWork::ci_in_transaction(),
        ],
        Bounds::Deep => vec![
            leased::LeasedWork::deep(),
            leased::LeasedWork::deep_two_failovers(),
            leased::LeasedWork::deep_two_items(),
            leased::LeasedWork::deep_in_transaction(),
        ],
    }
}

/// The runs models at `bounds`.
pub fn runs_models(bounds: Bounds) -> Vec<runs::Runs> {
    match bounds {
        Bounds::Ci => vec![runs::Runs::ci()],
        Bounds::Deep => vec![runs::Runs::deep()],
    }
}

/// The payouts models at `bounds`.
pub fn payouts_models(bounds: Bounds) -> Vec<payouts::Payouts> {
    match bounds {
        Bounds::Ci => vec![payouts::Payouts::ci_confirmed(), payouts::Payouts::ci_two_payouts()],
        Bounds::Deep => vec![payouts::Payouts::deep_confirmed(), payouts::Payouts::deep_two_payouts()],
    }
}

/// Checks every model at `bounds`, in order, handing each summary to
/// `each` as soon as it is done.
pub fn check_all(bounds: Bounds, mut each: impl FnMut(Summary)) {
    leased_models(bounds).into_iter().map(check_model).for_each(&mut each);
    runs_models(bounds).into_iter().map(check_model).for_each(&mut each);
    payouts_models(bounds).into_iter().map(check_model).for_each(&mut each);
}

/// A guard, removed from its model: the property its variant must break.
#[derive(Debug, Clone, Copy)]
pub struct GuardCase {
    /// The guard, as the code or the protocol has it.
    pub guard: &'static str,
    /// The property that must fail without it.
    pub property: &'static str,
    /// The test that replays the counterexample against the real database
    /// (None: the code does not exist yet).
    pub replayed_by: Option<&'static str>,
}

/// What a variant's check found.
#[derive(Debug, Clone)]
pub struct Counterexample {
    /// The case.
    pub case: GuardCase,
    /// The variant's name and bounds.
    pub model: String,
    /// The counterexample, one action a line (None: none was found).
    pub trace: Option<String>,
    /// States explored until it was found.
    pub states: usize,
}

fn counterexample<M>(case: GuardCase, model: M) -> Counterexample
where
    M: Described + Clone + Send + Sync + 'static,
    M::State: Debug + Clone + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Display + Debug + Clone + PartialEq + Send + Sync + 'static,
{
    let outcome: Outcome<M> = check::find(model.clone(), case.property);
    let trace = outcome
        .discoveries
        .get(case.property)
        .filter(|_| outcome.failed().contains(&case.property))
        .map(|path| check::trace(&model, &check::until_broken(&model, path, case.property)));
    Counterexample {
        case,
        model: outcome.name.clone(),
        trace,
        states: outcome.states,
    }
}

/// The fence, removed: the leased model without failovers (a zombie of a
/// rescue, not of a failover).
pub fn without_fence() -> Counterexample {
    let mut model = leased::LeasedWork::ci().without(leased::Guards {
        fence: false,
        ..leased::Guards::ALL
    });
    model.faults.failovers = 0;
    counterexample(
        GuardCase {
            guard: "the fence (ROW_FENCE = f.fence in complete_fenced)",
            property: leased::property::NO_STALE_COMPLETION,
            replayed_by: Some("tests/replay_leased.rs: without_the_fence_a_zombie_completes_in_the_live_claims_name"),
        },
        model,
    )
}

/// The timeline in the fence, removed: a failover is the only way left.
pub fn without_timeline() -> Counterexample {
    let mut model = leased::LeasedWork::ci().without(leased::Guards {
        timeline: false,
        ..leased::Guards::ALL
    });
    model.faults.pauses = 0;
    model.faults.slow_renewals = 0;
    counterexample(
        GuardCase {
            guard: "the timeline in the fence (fence_epoch)",
            property: leased::property::NO_STALE_COMPLETION,
            replayed_by: Some(
                "tests/replay_failover.rs: without_the_timeline_a_claim_lost_in_a_failover_completes_in_the_new_claims_name",
            ),
        },
        model,
    )
}

/// The idempotency key, removed.
pub fn without_idempotency_key() -> Counterexample {
    let mut model = leased::LeasedWork::ci().without(leased::Guards {
        idempotency_key: false,
        ..leased::Guards::ALL
    });
    model.faults.failovers = 0;
    counterexample(
        GuardCase {
            guard: "the idempotency key (payout_key(period, creator))",
            property: leased::property::PAID_AT_MOST_ONCE,
            replayed_by: Some("tests/replay_leased.rs: without_the_idempotency_key_a_retry_pays_the_creator_twice"),
        },
        model,
    )
}

fn payouts_without(guards: payouts::Guards) -> payouts::Payouts {
    payouts::Payouts::ci_confirmed().without(guards)
}

/// The conditional update on a payout's state, removed: three properties
/// it keeps.
pub fn without_state_condition() -> Vec<Counterexample> {
    let guards = payouts::Guards {
        state_condition: false,
        ..payouts::Guards::ALL
    };
    [
        payouts::property::RETURNED_AT_MOST_ONCE,
        payouts::property::RETURNED_ONLY_UNPAID,
        payouts::property::TOKEN_ONCE,
    ]
    .into_iter()
    .map(|property| {
        counterexample(
            GuardCase {
                guard: "the conditional update on the payout's state",
                property,
                replayed_by: None,
            },
            payouts_without(guards),
        )
    })
    .collect()
}

/// The unique event id on webhooks, removed.
pub fn without_event_id() -> Counterexample {
    counterexample(
        GuardCase {
            guard: "the unique event id of provider webhooks",
            property: payouts::property::EVENT_AT_MOST_ONCE,
            replayed_by: None,
        },
        payouts_without(payouts::Guards {
            event_id: false,
            ..payouts::Guards::ALL
        }),
    )
}

/// The payouts' idempotency key, removed.
pub fn without_payout_key() -> Counterexample {
    counterexample(
        GuardCase {
            guard: "the payout's idempotency key (derived from its id)",
            property: payouts::property::PAID_AT_MOST_ONCE,
            replayed_by: None,
        },
        payouts_without(payouts::Guards {
            idempotency_key: false,
            ..payouts::Guards::ALL
        }),
    )
}

/// The partial unique index `runs_one_running_per_job`, removed.
pub fn without_one_running_per_job() -> Counterexample {
    counterexample(
        GuardCase {
            guard: "the partial unique index runs_one_running_per_job",
            property: runs::property::ONE_RUNNING,
            replayed_by: None,
        },
        runs::Runs::ci().without(runs::Guards {
            one_running_per_job: false,
        }),
    )
}

/// Every guard's counterexample.
pub fn counterexamples() -> Vec<Counterexample> {
    let mut out = vec![without_fence(), without_timeline(), without_idempotency_key()];
    out.extend(without_state_condition());
    out.push(without_event_id());
    out.push(without_payout_key());
    out.push(without_one_running_per_job());
    out
}
