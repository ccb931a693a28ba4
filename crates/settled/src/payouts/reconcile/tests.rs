//! The verdict table and every kind of mismatch, on payouts and payments
//! made here.

use super::*;
use crate::money::Amount;
use crate::payouts::{PayoutKind, PayoutRow, PayoutState};
use crate::provider::{Payment, PaymentStatus};

const CREATOR: &str = "0x00000000000000000000000000000000000000aa";
const OTHER_CREATOR: &str = "0x00000000000000000000000000000000000000bb";

fn payout(id: i64, state: PayoutState, amount: &str) -> PayoutRecord {
    PayoutRecord {
        payout: PayoutRow {
            id,
            kind: PayoutKind::Withdrawal,
            creator: crate::address::CreatorAddress::parse(CREATOR).unwrap(),
            amount: Amount::parse_decimal(amount).unwrap(),
            state,
            provider_key: format!("payout-{id}"),
            reference: id.to_string(),
            idempotency_key: None,
            provider_id: None,
        },
        stranded: None,
        awaiting_operator: None,
    }
}

fn payment(n: u32, key: &str, status: PaymentStatus, amount: &str, reference: Option<&str>) -> Payment {
    Payment {
        id: format!("pay_{n}"),
        idempotency_key: key.into(),
        creator: CREATOR.into(),
        amount: amount.into(),
        status,
        failure_reason: None,
        reference: reference.map(str::to_string),
    }
}

fn kinds(c: &Comparison) -> Vec<(MismatchKind, Option<i64>)> {
    c.mismatches.iter().map(|m| (m.kind, m.payout_id)).collect()
}

#[test]
fn the_table_of_verdicts() {
    use PaymentStatus as P;
    use PayoutState as S;
    assert_eq!(judge(S::Queued, P::Paid), Verdict::InFlight);
    assert_eq!(judge(S::Sent, P::Pending), Verdict::Agree);
    assert_eq!(judge(S::Sent, P::Failed), Verdict::Behind);
    assert_eq!(judge(S::Paid, P::Paid), Verdict::Agree);
    assert_eq!(judge(S::Sent, P::Returned), Verdict::Behind);
    assert_eq!(judge(S::Paid, P::Pending), Verdict::Disagree);
    // A return (or failed after paid) the payout has not heard of yet.
    assert_eq!(judge(S::Paid, P::Failed), Verdict::Behind);
    assert_eq!(judge(S::Paid, P::Returned), Verdict::Behind);
    assert_eq!(judge(S::Failed, P::Failed), Verdict::Agree);
    assert_eq!(judge(S::Failed, P::Returned), Verdict::Agree);
    assert_eq!(judge(S::Failed, P::Paid), Verdict::Disagree);
    assert_eq!(judge(S::Returned, P::Returned), Verdict::Agree);
    assert_eq!(judge(S::Returned, P::Failed), Verdict::Agree);
    assert_eq!(judge(S::Returned, P::Paid), Verdict::Disagree);
    assert_eq!(judge(S::Returned, P::Pending), Verdict::Disagree);
    for never_sent in [S::Created, S::Cancelled, S::Expired] {
        for status in PaymentStatus::ALL {
            assert_eq!(judge(never_sent, status), Verdict::Disagree);
        }
    }
}

#[test]
fn every_kind_is_found_and_named() {
    use PaymentStatus as P;
    use PayoutState as S;
    let payouts = vec![
        payout(1, S::Paid, "10"),   // agrees
        payout(2, S::Paid, "10"),   // missing at the provider
        payout(3, S::Paid, "10"),   // amount differs
        payout(4, S::Paid, "10"),   // creator differs
        payout(5, S::Failed, "10"), // the provider paid it
        payout(6, S::Paid, "10"),   // paid again under another key
        payout(7, S::Queued, "10"), // in flight
        payout(8, S::Sent, "10"),   // behind
        payout(9, S::Failed, "10"), // refused: no payment, agrees
        PayoutRecord {
            stranded: Some("its delivery job is a dead letter".into()),
            ..payout(10, S::Queued, "10") // nothing will send it
        },
        PayoutRecord {
            stranded: Some("its delivery job is a dead letter".into()),
            awaiting_operator: Some("the provider cannot say".into()),
            ..payout(11, S::Queued, "10") // its key waits for an operator
        },
    ];
    let mut other_creator = payment(4, "payout-4", P::Paid, "10", Some("4"));
    other_creator.creator = OTHER_CREATOR.into();
    let payments = vec![
        payment(1, "payout-1", P::Paid, "010", Some("1")),
        payment(3, "payout-3", P::Paid, "11", Some("3")),
        other_creator,
        payment(5, "payout-5", P::Paid, "10", Some("5")),
        payment(6, "payout-6", P::Paid, "10", Some("6")),
        payment(60, "manual-6", P::Pending, "10", Some("6")),
        payment(61, "manual-6-failed", P::Failed, "10", Some("6")),
        payment(7, "payout-7", P::Paid, "10", Some("7")),
        payment(8, "payout-8", P::Paid, "10", Some("8")),
    ];
    let c = compare(&payouts, &payments);
    assert_eq!(
        kinds(&c),
        [
            (MismatchKind::MissingAtProvider, Some(2)),
            (MismatchKind::UnknownToSettled, None),
            (MismatchKind::UnknownToSettled, None),
            (MismatchKind::AmountDiffers, Some(3)),
            (MismatchKind::CreatorDiffers, Some(4)),
            (MismatchKind::StatesDisagree, Some(5)),
            (MismatchKind::PaidTwice, Some(6)),
            (MismatchKind::Stranded, Some(10)),
            (MismatchKind::AwaitingOperator, Some(11)),
        ]
    );
    let twice = c.of(MismatchKind::PaidTwice).next().unwrap();
    assert_eq!(twice.provider_ids, ["pay_6", "pay_60"], "a failed payment pays nothing");
    assert_eq!(c.in_flight.iter().map(|l| l.payout_id).collect::<Vec<_>>(), [7]);
    assert_eq!(c.behind.iter().map(|l| l.payout_id).collect::<Vec<_>>(), [8]);
    assert_eq!(c.agreeing, 5, "1, 6 (by its own key), 7, 8 and 9");
    let checks = c.checks();
    assert_eq!(checks.iter().filter(|c| !c.ok).count(), 8);
    assert!(checks[0].offenders[0].starts_with("payout 2 (payout-2): settled says paid"));
}

#[test]
fn unknown_payments_sharing_creator_and_reference_are_paid_twice() {
    let payments = vec![
        payment(1, "a", PaymentStatus::Paid, "5", Some("invoice-9")),
        payment(2, "b", PaymentStatus::Pending, "5", Some("invoice-9")),
    ];
    let c = compare(&[], &payments);
    assert_eq!(c.of(MismatchKind::UnknownToSettled).count(), 2);
    assert_eq!(c.of(MismatchKind::PaidTwice).count(), 1);
    assert!(compare(&[], &[]).ok());
}
