//! The checks this crate stands for, in one place: each model at the
//! bounds `cargo test` runs and at deeper ones, and each guard's variant
//! with the property it must break. The tests and the binary both run
//! these, so the documented figures are the tested ones.

use std::fmt::{Debug, Display};
use std::hash::Hash;

use crate::check::{self, Described, Outcome};
use crate::{chain, leased, payouts, runs};

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
    /// The properties that did not.
    pub failed: Vec<&'static str>,
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
        failed: outcome.failed(),
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
        Bounds::Ci => vec![
            payouts::Payouts::ci_confirmed(),
            payouts::Payouts::ci_two_payouts(),
            payouts::Payouts::ci_repeated_request(),
            payouts::Payouts::ci_returned(),
        ],
        Bounds::Deep => vec![
            payouts::Payouts::deep_confirmed(),
            payouts::Payouts::deep_two_payouts(),
            payouts::Payouts::deep_repeated_requests(),
            payouts::Payouts::deep_returned(),
        ],
    }
}

/// The chain rail's models at `bounds`.
pub fn chain_models(bounds: Bounds) -> Vec<chain::Chain> {
    match bounds {
        Bounds::Ci => vec![chain::Chain::ci(), chain::Chain::two_payouts()],
        Bounds::Deep => vec![chain::Chain::two_payouts()],
    }
}

/// Checks every model at `bounds`, in order, handing each summary to
/// `each` as soon as it is done.
pub fn check_all(bounds: Bounds, mut each: impl FnMut(Summary)) {
    leased_models(bounds).into_iter().map(check_model).for_each(&mut each);
    runs_models(bounds).into_iter().map(check_model).for_each(&mut each);
    payouts_models(bounds).into_iter().map(check_model).for_each(&mut each);
    chain_models(bounds).into_iter().map(check_model).for_each(&mut each);
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
    let mut model = leased::LeasedWork::ci().without(all_but(leased::Guards::ALL, |g| g.fence = false));
    model.faults.failovers = 0;
    replayed_case(
        "the fence (ROW_FENCE = f.fence in complete_fenced)",
        leased::property::NO_STALE_COMPLETION,
        "tests/replay_leased.rs: without_the_fence_a_zombie_completes_in_the_live_claims_name",
        model,
    )
}

/// The timeline in the fence, removed: a failover is the only way left.
pub fn without_timeline() -> Counterexample {
    let mut model = leased::LeasedWork::ci().without(all_but(leased::Guards::ALL, |g| g.timeline = false));
    model.faults.pauses = 0;
    model.faults.slow_renewals = 0;
    replayed_case(
        "the timeline in the fence (fence_epoch)",
        leased::property::NO_STALE_COMPLETION,
        "tests/replay_failover.rs: without_the_timeline_a_claim_lost_in_a_failover_completes_in_the_new_claims_name",
        model,
    )
}

/// The idempotency key, removed.
pub fn without_idempotency_key() -> Counterexample {
    let mut model = leased::LeasedWork::ci().without(all_but(leased::Guards::ALL, |g| g.idempotency_key = false));
    model.faults.failovers = 0;
    replayed_case(
        "the idempotency key (payout_key(period, creator))",
        leased::property::PAID_AT_MOST_ONCE,
        "tests/replay_leased.rs: without_the_idempotency_key_a_retry_pays_the_creator_twice",
        model,
    )
}

/// A guard's case, replayed by `replayed_by`, on `model`.
fn replayed_case<M>(guard: &'static str, property: &'static str, replayed_by: &'static str, model: M) -> Counterexample
where
    M: Described + Clone + Send + Sync + 'static,
    M::State: Debug + Clone + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Display + Debug + Clone + PartialEq + Send + Sync + 'static,
{
    counterexample(
        GuardCase {
            guard,
            property,
            replayed_by: Some(replayed_by),
        },
        model,
    )
}

/// Every guard of `all` but those `off` turns off.
fn all_but<G>(all: G, off: impl FnOnce(&mut G)) -> G {
    let mut guards = all;
    off(&mut guards);
    guards
}

/// The three guards of a payout's state turned off: the conditional
/// update, the transitions table and the return's primary key.
fn state_guards_off(guards: &mut payouts::Guards) {
    guards.state_condition = false;
    guards.transition_table = false;
    guards.one_return = false;
}

/// `model` with one redemption: no second confirmation in its traces.
fn one_redemption(mut model: payouts::Payouts) -> payouts::Payouts {
    model.faults.redemptions = 1;
    model
}

/// One payout without confirmation, one delivery worker, its payment
/// failing and the webhook duplicated.
fn one_webhook() -> payouts::Payouts {
    payouts::Payouts {
        requests: 1,
        credit: 1,
        confirm: false,
        workers: 1,
        max_attempts: 1,
        faults: payouts::Faults {
            provider_failures: 1,
            webhook_duplicates: 1,
            ..payouts::Faults::default()
        },
        guards: payouts::Guards::ALL,
    }
}

/// The conditional update on a payout's state (`move_payout`) and the
/// transitions table the trigger checks, removed: a paid payout's funds
/// come back.
pub fn without_state_condition_and_transitions() -> Counterexample {
    replayed_case(
        "the conditional update on the payout's state (move_payout) and the transitions table (check_payout_change)",
        payouts::property::RETURNED_ONLY_UNPAID,
        "tests/replay_payouts/: without_the_conditional_update_and_the_transitions_table_a_paid_payout_is_returned",
        payouts::Payouts::ci_confirmed().without(all_but(payouts::Guards::ALL, |g| {
            g.state_condition = false;
            g.transition_table = false;
        })),
    )
}

/// The three guards of a payout's state removed (the conditional update,
/// the transitions table, the return's primary key): funds come back twice.
pub fn without_state_guards() -> Counterexample {
    replayed_case(
        "the conditional update, the transitions table and payout_returns' primary key",
        payouts::property::RETURNED_AT_MOST_ONCE,
        "tests/replay_payouts/: without_the_state_guards_a_payout_is_returned_twice",
        one_redemption(payouts::Payouts::ci_confirmed()).without(all_but(payouts::Guards::ALL, state_guards_off)),
    )
}

/// The return's guards removed (the conditional update of
/// `apply_provider_word`, the transitions table, payout_returns' primary
/// key): a return heard before its paid, and heard again, gives the money
/// back twice.
pub fn without_return_guards() -> Counterexample {
    replayed_case(
        "the return's conditional update (apply_provider_word along provider_word_moves), the transitions table and payout_returns' primary key",
        payouts::property::RETURNED_AT_MOST_ONCE,
        "tests/replay_payouts/: without_the_returns_guards_a_return_gives_the_money_back_twice",
        one_return().without(all_but(payouts::Guards::ALL, state_guards_off)),
    )
}

/// One payout without confirmation, one delivery worker, its payment paid
/// and then returned.
fn one_return() -> payouts::Payouts {
    payouts::Payouts {
        faults: payouts::Faults {
            returns: 1,
            ..payouts::Faults::default()
        },
        ..one_webhook()
    }
}

/// The token's condition (`redeem_in`) and the conditional update,
/// removed: two confirmations both redeem the token.
pub fn without_token_conditions() -> Counterexample {
    replayed_case(
        "the token's condition (redeem_in: status = 'issued') and the conditional update",
        payouts::property::TOKEN_ONCE,
        "tests/replay_payouts/: without_the_token_and_state_conditions_two_confirmations_both_redeem",
        payouts::Payouts::ci_confirmed().without(all_but(payouts::Guards::ALL, |g| {
            g.state_condition = false;
            g.one_time_token = false;
        })),
    )
}

/// The unique event id on webhooks, removed.
pub fn without_event_id() -> Counterexample {
    replayed_case(
        "the unique event id of provider webhooks (provider_events' primary key)",
        payouts::property::EVENT_AT_MOST_ONCE,
        "tests/replay_payouts/: without_the_unique_event_id_a_duplicated_webhook_is_recorded_twice",
        one_webhook().without(all_but(payouts::Guards::ALL, |g| g.event_id = false)),
    )
}

/// The request's key removed: its claim (`idempotency::begin`, `finish`)
/// and the unique `payouts.idempotency_key`.
pub fn without_request_key() -> Counterexample {
    replayed_case(
        "the payout request's Idempotency-Key (idempotency::begin/finish and payouts.idempotency_key UNIQUE)",
        payouts::property::REQUEST_ONCE,
        "tests/replay_payouts/: without_the_request_key_two_posts_make_two_payouts",
        payouts::Payouts::ci_repeated_request().without(all_but(payouts::Guards::ALL, |g| {
            g.request_key = false;
            g.unique_request_key = false;
        })),
    )
}

/// The provider key derived from the payout, removed: a paused worker and
/// the rescue's claim both pay (one payout, two workers, one pause).
pub fn without_payout_key() -> Counterexample {
    let model = payouts::Payouts {
        requests: 1,
        credit: 1,
        confirm: false,
        workers: 2,
        max_attempts: 2,
        faults: payouts::Faults {
            pauses: 1,
            ..payouts::Faults::default()
        },
        guards: all_but(payouts::Guards::ALL, |g| g.idempotency_key = false),
    };
    replayed_case(
        "the payout's provider key (provider_key, derived from its id)",
        payouts::property::PAID_AT_MOST_ONCE,
        "tests/replay_payouts/: without_the_provider_key_a_zombie_and_its_rescuer_pay_twice",
        model,
    )
}

/// Guards that stand behind one another: each variant without one of them
/// (the others kept) must still hold every property but the ones listed.
pub fn payouts_layers() -> Vec<(payouts::Payouts, &'static [&'static str])> {
    let without =
        |model: payouts::Payouts, off: fn(&mut payouts::Guards)| model.without(all_but(payouts::Guards::ALL, off));
    // The CI bounds without the pause: a blind
    // write's read and write interleave with everything, so a variant's
    // space is larger.
    let confirmed = || payouts::Payouts {
        faults: payouts::Faults {
            pauses: 0,
            ..payouts::Payouts::ci_confirmed().faults
        },
        ..payouts::Payouts::ci_confirmed()
    };
    vec![
        (without(confirmed(), |g| g.state_condition = false), &[]),
        (without(confirmed(), |g| g.transition_table = false), &[]),
        (without(confirmed(), |g| g.one_return = false), &[]),
        (without(confirmed(), |g| g.one_time_token = false), &[]),
        (
            without(confirmed(), |g| g.event_id = false),
            // A repeat is recorded (as `already`), so it is not "ignored".
            &[
                payouts::property::EVENT_AT_MOST_ONCE,
                "a duplicated webhook is answered and ignored",
            ],
        ),
        (
            without(payouts::Payouts::ci_repeated_request(), |g| g.request_key = false),
            &[],
        ),
        (
            without(payouts::Payouts::ci_repeated_request(), |g| {
                g.unique_request_key = false
            }),
            &[],
        ),
    ]
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

/// Write-ahead signing removed: a deliverer killed between the broadcast
/// and storing what it sent signs the payout again under the next nonce,
/// and both transfers are mined.
pub fn without_write_ahead() -> Counterexample {
    replayed_case(
        "write-ahead signing (the transaction stored before its broadcast, chain/sign.rs)",
        chain::property::PAID_AT_MOST_ONCE,
        "tests/replay_chain.rs: without_write_ahead_a_deliverer_killed_after_its_broadcast_signs_again_and_pays_twice (anvil)",
        chain::Chain::ci().without(all_but(chain::Guards::ALL, |g| g.write_ahead = false)),
    )
}

/// Every attempt's hash kept, removed (only the latest): a replaced
/// transaction's original is mined, read as "nonce taken by another", and
/// the payout is paid again.
pub fn without_every_attempt() -> Counterexample {
    replayed_case(
        "every attempt's hash kept and looked for (chain_tx_attempts)",
        chain::property::PAID_AT_MOST_ONCE,
        "tests/replay_chain.rs: tracking_only_the_latest_attempt_misreads_a_mined_original_and_pays_twice (anvil)",
        chain::Chain::ci().without(all_but(chain::Guards::ALL, |g| g.every_attempt = false)),
    )
}

/// The confirmation depth removed (paid at inclusion): a reorg of one block
/// leaves a paid payout without its transfer.
pub fn without_depth() -> Counterexample {
    replayed_case(
        "the confirmation depth (--confirmations)",
        chain::property::PAID_IS_ON_CHAIN,
        "tests/replay_chain.rs: paid_at_inclusion_a_reorg_leaves_a_paid_payout_unpaid_and_at_depth_it_is_not (anvil)",
        chain::Chain::ci().without(all_but(chain::Guards::ALL, |g| g.depth = false)),
    )
}

/// The requeue only after the filler is confirmed, removed: the original
/// transfer is mined instead of the filler, and the requeued payout's new
/// transaction pays it again.
pub fn without_filler_confirmed() -> Counterexample {
    replayed_case(
        "a given-up nonce's payouts queued again only once its filler is confirmed",
        chain::property::PAID_AT_MOST_ONCE,
        "tests/replay_chain.rs: requeued_before_its_filler_is_confirmed_a_payout_is_paid_twice_and_after_it_is_not (anvil)",
        chain::Chain::ci().without(all_but(chain::Guards::ALL, |g| g.filler_confirmed = false)),
    )
}

/// Every guard's counterexample.
pub fn counterexamples() -> Vec<Counterexample> {
    vec![
        without_write_ahead(),
        without_every_attempt(),
        without_depth(),
        without_filler_confirmed(),
        without_fence(),
        without_timeline(),
        without_idempotency_key(),
        without_state_condition_and_transitions(),
        without_state_guards(),
        without_return_guards(),
        without_token_conditions(),
        without_event_id(),
        without_request_key(),
        without_payout_key(),
        without_one_running_per_job(),
    ]
}
