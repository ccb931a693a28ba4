//! Every model checked at the bounds `cargo test` runs: each property holds
//! (each `sometimes` is reached, so no model is vacuous), and the state
//! graph has no cycle (so each `eventually` was checked on every
//! behaviour). Then each guard removed: its variant must give a
//! counterexample, printed one action a line (`-- --show-output`).

use settled_models::suite::{self, Bounds, Counterexample, Summary};

fn assert_holds(summaries: Vec<Summary>) {
    for summary in summaries {
        println!("{}", summary.report);
        assert!(summary.all_held, "{}", summary.report);
        assert!(
            summary.acyclic.is_ok(),
            "{}: a cycle, so `eventually` is unchecked on it:\n{}",
            summary.name,
            summary.acyclic.unwrap_err()
        );
        assert_eq!(
            summary.searched_states, summary.unique_states,
            "{}: the cycle search and the checker saw different state spaces",
            summary.name
        );
    }
}

#[test]
fn leased_work_holds_every_property_at_ci_bounds() {
    let summaries = suite::leased_models(Bounds::Ci)
        .into_iter()
        .map(suite::check_model)
        .collect();
    assert_holds(summaries);
}

#[test]
fn runs_hold_every_property_at_ci_bounds() {
    let summaries = suite::runs_models(Bounds::Ci)
        .into_iter()
        .map(suite::check_model)
        .collect();
    assert_holds(summaries);
}

#[test]
fn payouts_hold_every_property_at_ci_bounds() {
    let summaries = suite::payouts_models(Bounds::Ci)
        .into_iter()
        .map(suite::check_model)
        .collect();
    assert_holds(summaries);
}

#[test]
fn the_chain_rail_holds_every_property_at_ci_bounds() {
    let summaries = suite::chain_models(Bounds::Ci)
        .into_iter()
        .map(suite::check_model)
        .collect();
    assert_holds(summaries);
}

/// The variant breaks the property; the trace is printed.
fn assert_counterexample(found: &Counterexample) -> String {
    let trace = found.trace.clone().unwrap_or_else(|| {
        panic!(
            "{}: no counterexample to \"{}\" without {} ({} states)",
            found.model, found.case.property, found.case.guard, found.states
        )
    });
    println!(
        "without {}: \"{}\" fails ({}):\n{trace}",
        found.case.guard, found.case.property, found.model
    );
    trace
}

#[test]
fn without_the_fence_a_zombies_completion_is_accepted() {
    let trace = assert_counterexample(&suite::without_fence());
    // A zombie of a rescue: paused or slow past its lease, no failover.
    assert!(trace.contains("rescue_expired_leases"), "{trace}");
    assert!(!trace.contains("FAILOVER"), "{trace}");
}

#[test]
fn without_the_timeline_in_the_fence_a_claim_lost_in_a_failover_completes() {
    let trace = assert_counterexample(&suite::without_timeline());
    assert!(trace.contains("FAILOVER"), "{trace}");
}

#[test]
fn without_the_idempotency_key_the_provider_pays_an_item_twice() {
    assert_counterexample(&suite::without_idempotency_key());
}

#[test]
fn without_the_conditional_update_and_the_transitions_table_a_paid_payout_is_returned() {
    let trace = assert_counterexample(&suite::without_state_condition_and_transitions());
    assert!(trace.contains("(blind)"), "{trace}");
}

#[test]
fn without_the_three_state_guards_a_payout_is_returned_twice() {
    assert_counterexample(&suite::without_state_guards());
}

#[test]
fn without_the_returns_guards_a_return_gives_the_money_back_twice() {
    let trace = assert_counterexample(&suite::without_return_guards());
    assert!(trace.contains("returned"), "{trace}");
}

#[test]
fn without_the_token_and_state_conditions_a_token_is_redeemed_twice() {
    assert_counterexample(&suite::without_token_conditions());
}

#[test]
fn without_the_unique_event_id_a_duplicated_webhook_is_recorded_twice() {
    assert_counterexample(&suite::without_event_id());
}

#[test]
fn without_the_request_key_one_request_makes_two_payouts() {
    assert_counterexample(&suite::without_request_key());
}

#[test]
fn without_the_payouts_provider_key_a_zombie_and_its_rescuer_pay_twice() {
    let trace = assert_counterexample(&suite::without_payout_key());
    assert!(trace.contains("SIGSTOP") && trace.contains("rescue_expired"), "{trace}");
}

/// The payout guards stand behind one another: without any one of them
/// (the others kept) every property still holds, but the event log's.
#[test]
fn each_payout_guard_alone_is_backed_by_another() {
    for (model, may_fail) in suite::payouts_layers() {
        let summary = suite::check_model(model);
        println!("{}", summary.report);
        let unexpected: Vec<&str> = summary
            .failed
            .iter()
            .filter(|p| !may_fail.contains(p))
            .copied()
            .collect();
        assert!(
            unexpected.is_empty(),
            "{}: {unexpected:?}\n{}",
            summary.name,
            summary.report
        );
        assert!(summary.acyclic.is_ok(), "{}: a cycle", summary.name);
    }
}

#[test]
fn without_one_running_run_per_job_two_runs_run_at_once() {
    assert_counterexample(&suite::without_one_running_per_job());
}

#[test]
fn without_write_ahead_signing_a_retry_signs_under_a_new_nonce_and_pays_twice() {
    let trace = assert_counterexample(&suite::without_write_ahead());
    assert!(
        trace.contains("SIGKILL") && trace.matches("sign a transfer").count() == 2,
        "{trace}"
    );
}

#[test]
fn tracking_only_the_latest_attempt_misreads_a_mined_original_and_pays_twice() {
    let trace = assert_counterexample(&suite::without_every_attempt());
    assert!(
        trace.contains("replacement") && trace.contains("nonce taken"),
        "{trace}"
    );
}

#[test]
fn marking_paid_at_inclusion_leaves_a_paid_payout_unpaid_after_a_reorg() {
    let trace = assert_counterexample(&suite::without_depth());
    assert!(trace.contains("REORG"), "{trace}");
}

#[test]
fn requeueing_before_the_filler_is_confirmed_pays_twice() {
    let trace = assert_counterexample(&suite::without_filler_confirmed());
    assert!(trace.contains("filler"), "{trace}");
}
