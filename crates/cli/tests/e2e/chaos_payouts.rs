//! A short seeded payout storm: `settled chaos --payouts` runs two API
//! servers, four deliverers and the provider simulator under every fault
//! (returns of paid payments and forgotten keys among them),
//! then checks every invariant itself; here the report is read back and
//! each fault, and each kind of duplicate, is required to have happened.

use crate::common;

use serde_json::Value;

fn count(counts: &Value, field: &str) -> u64 {
    counts[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no count {field}: {counts:#}"))
}

#[test]
fn a_payout_storm_under_every_fault_pays_each_payout_once_or_returns_it() {
    let (out, report) = common::chaos_report(&[
        "--payouts",
        "--requests",
        "1200",
        "--clients",
        "24",
        "--workers",
        "4",
        "--servers",
        "2",
        "--duration",
        "20",
        "--seed",
        "21",
        "--json",
    ]);
    println!("{report:#}");
    assert!(out.status.success(), "payout chaos failed: {report:#}");
    assert_eq!(report["ok"], true);
    let injected = report["injected"].to_string();
    for fault in [
        "SIGKILL",
        "SIGSTOP",
        "pg_terminate_backend",
        "answers 503",
        "answers 429",
        "applies 30%",
        "webhooks moved",
    ] {
        assert!(injected.contains(fault), "no {fault} injected: {injected}");
    }
    if std::env::var("TEST_DATABASE_URL").is_err() {
        assert!(injected.contains("restarted PostgreSQL"), "{injected}");
    }
    let names: Vec<&str> = report["invariants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i[0].as_str().unwrap())
        .collect();
    for name in [
        "no_payout_stuck",
        "paid_exactly_once_at_the_provider",
        "unpaid_payouts_never_paid",
        "every_provider_payment_is_its_payout",
        "returned_exactly_once",
        "one_payout_per_request",
        "racing_confirmations_have_one_winner",
        "balance_is_credits_less_unreturned_payouts",
        "statements_add_up_to_balances",
        "no_conflicts_recorded",
    ] {
        assert!(names.contains(&name), "invariant {name} not checked: {names:?}");
    }
    let counts = &report["payouts"];
    assert!(count(counts, "payouts") > 0, "{counts:#}");
    let paid = counts["by_state"]["paid"].as_u64().unwrap_or(0);
    assert!(paid > 0, "{counts:#}");
    // Each provider application is one paid, failed or returned payout:
    // nothing applied twice, though the provider forgot every key.
    let failed_at_provider = counts["by_state"]["failed"].as_u64().unwrap_or(0);
    let returned = counts["by_state"]["returned"].as_u64().unwrap_or(0);
    assert!(
        count(counts, "provider_applications") <= paid + failed_at_provider + returned,
        "{counts:#}"
    );
    assert!(returned > 0, "no payout returned after paid: {counts:#}");
    assert_eq!(
        count(counts, "returned_after_paid"),
        count(counts, "provider_returns"),
        "every return the provider made, and no other, came back to a balance: {counts:#}"
    );
    for field in [
        "returned",
        "api_replays",
        "provider_replays",
        "webhooks_duplicated",
        "webhooks_reordered",
        "webhooks_lost",
        "lookups",
        "reference_lookups",
        "provider_503s",
        "provider_429s",
        "late_applies",
        "refusals",
        "confirmations",
        "cancels",
    ] {
        assert!(count(counts, field) > 0, "no {field}: {counts:#}");
    }
    assert_eq!(count(counts, "conflicts"), 0, "{counts:#}");
    for state in ["expired", "cancelled", "failed"] {
        assert!(
            counts["by_state"][state].as_u64().unwrap_or(0) > 0,
            "no payout {state}: {counts:#}"
        );
    }
}
