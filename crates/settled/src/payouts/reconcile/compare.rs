//! The comparison itself, pure: each payout against the payment under its
//! key ([`judge`]'s table), what differs between them, and the payouts paid
//! twice.

use std::collections::{HashMap, HashSet};

use super::{Comparison, Lag, Mismatch, MismatchKind, PayoutRecord, Verdict};
use crate::payouts::word::same_amount;
use crate::payouts::{PayoutKind, PayoutRow, PayoutState};
use crate::provider::{Payment, PaymentStatus};

/// The module's table: settled's `state` against the provider's `status`
/// of the payment under the payout's key.
pub(crate) fn judge(state: PayoutState, status: PaymentStatus) -> Verdict {
    use PaymentStatus as P;
    use PayoutState as S;
    match (state, status) {
        (S::Queued, _) => Verdict::InFlight,
        (S::Sent, P::Pending) | (S::Paid, P::Paid) => Verdict::Agree,
        (S::Failed | S::Returned, P::Failed | P::Returned) => Verdict::Agree,
        (S::Sent, P::Paid | P::Failed | P::Returned) | (S::Paid, P::Failed | P::Returned) => Verdict::Behind,
        (S::Paid, P::Pending)
        | (S::Failed | S::Returned, P::Pending | P::Paid)
        | (S::Created | S::Cancelled | S::Expired, _) => Verdict::Disagree,
    }
}

/// Compares `payouts` with `payments` (see the module's table). Pure: the
/// callers read both sides.
pub(crate) fn compare(payouts: &[PayoutRecord], payments: &[Payment]) -> Comparison {
    let mut by_key: HashMap<&str, Vec<&Payment>> = HashMap::new();
    for payment in payments {
        by_key
            .entry(payment.idempotency_key.as_str())
            .or_default()
            .push(payment);
    }
    let mut out = Comparison {
        payouts: payouts.len(),
        payments: payments.len(),
        ..Comparison::default()
    };
    for payout in payouts {
        let found = by_key.get(payout.payout.provider_key.as_str()).map(Vec::as_slice);
        compare_one(payout, found.and_then(|p| p.first().copied()), &mut out);
    }
    let known: HashSet<&str> = payouts.iter().map(|p| p.payout.provider_key.as_str()).collect();
    for payment in payments.iter().filter(|p| !known.contains(p.idempotency_key.as_str())) {
        out.mismatches.push(Mismatch {
            kind: MismatchKind::UnknownToSettled,
            payout_id: None,
            key: payment.idempotency_key.clone(),
            provider_ids: vec![payment.id.clone()],
            detail: format!(
                "the provider's payment {} ({} to {}, {}{}) matches no payout",
                payment.id,
                payment.amount,
                payment.creator,
                payment.status,
                payment
                    .reference
                    .as_deref()
                    .map(|r| format!(", reference {r:?}"))
                    .unwrap_or_default()
            ),
        });
    }
    out.mismatches.extend(paid_twice(payouts, payments));
    out.mismatches.sort_by_key(|m| {
        (
            MismatchKind::ALL.iter().position(|k| *k == m.kind),
            m.payout_id,
            m.key.clone(),
        )
    });
    out
}

/// One payout against the payment under its key (the first, when the
/// provider lists several: [`paid_twice`] reports the others).
fn compare_one(record: &PayoutRecord, payment: Option<&Payment>, out: &mut Comparison) {
    let payout = &record.payout;
    let mismatch = |kind, provider_ids: Vec<String>, detail: String| Mismatch {
        kind,
        payout_id: Some(payout.id),
        key: payout.provider_key.clone(),
        provider_ids,
        detail,
    };
    if let Some(why) = &record.awaiting_operator {
        out.mismatches.push(mismatch(
            MismatchKind::AwaitingOperator,
            payment.map(|p| vec![p.id.clone()]).unwrap_or_default(),
            format!(
                "settled holds {} for {} as {}, and sends nothing under its key until an operator checks: {why}",
                payout.amount, payout.creator, payout.state
            ),
        ));
    }
    // A payout waiting for an operator is named as such, not as stranded.
    let stranded =
        payout.state == PayoutState::Queued && record.stranded.is_some() && record.awaiting_operator.is_none();
    let waiting = stranded || record.awaiting_operator.is_some();
    if let (true, Some(why)) = (stranded, &record.stranded) {
        out.mismatches.push(mismatch(
            MismatchKind::Stranded,
            payment.map(|p| vec![p.id.clone()]).unwrap_or_default(),
            format!(
                "settled holds {} for {} as queued, and nothing will send it: {why}",
                payout.amount, payout.creator
            ),
        ));
    }
    let Some(payment) = payment else {
        if matches!(payout.state, PayoutState::Sent | PayoutState::Paid) {
            out.mismatches.push(mismatch(
                MismatchKind::MissingAtProvider,
                Vec::new(),
                format!(
                    "settled says {} {} to {}, but the provider has no payment under its key",
                    payout.state, payout.amount, payout.creator
                ),
            ));
        } else {
            out.agreeing += usize::from(!waiting);
        }
        return;
    };
    let found = differences(payout, payment);
    out.agreeing += usize::from(found.is_empty() && !waiting);
    for (kind, detail) in found {
        out.mismatches.push(mismatch(kind, vec![payment.id.clone()], detail));
    }
    let lag = Lag {
        payout_id: payout.id,
        key: payout.provider_key.clone(),
        state: payout.state,
        provider_status: payment.status,
    };
    match judge(payout.state, payment.status) {
        Verdict::InFlight => out.in_flight.push(lag),
        Verdict::Behind => out.behind.push(lag),
        Verdict::Agree | Verdict::Disagree => {}
    }
}

/// What differs between a payout and the payment under its key: amount,
/// creator, and states that contradict each other.
fn differences(payout: &PayoutRow, payment: &Payment) -> Vec<(MismatchKind, String)> {
    let mut found = Vec::new();
    if !same_amount(&payment.amount, payout.amount) {
        found.push((
            MismatchKind::AmountDiffers,
            format!(
                "the payout is for {}, the provider's payment {} for {}",
                payout.amount, payment.id, payment.amount
            ),
        ));
    }
    if !payment.creator.eq_ignore_ascii_case(payout.creator.as_str()) {
        found.push((
            MismatchKind::CreatorDiffers,
            format!(
                "the payout pays {}, the provider's payment {} pays {}",
                payout.creator, payment.id, payment.creator
            ),
        ));
    }
    if judge(payout.state, payment.status) == Verdict::Disagree {
        let returned = if payout.state.returns_funds() {
            " (its funds were returned)"
        } else {
            ""
        };
        found.push((
            MismatchKind::StatesDisagree,
            format!(
                "settled says {}{returned}, the provider's payment {} is {}",
                payout.state, payment.id, payment.status
            ),
        ));
    }
    found
}

/// The payouts claimed by more than one payment that has not failed, and
/// payments naming no payout that share creator and reference.
fn paid_twice(payouts: &[PayoutRecord], payments: &[Payment]) -> Vec<Mismatch> {
    let by_key: HashMap<&str, &PayoutRow> = payouts
        .iter()
        .map(|p| (p.payout.provider_key.as_str(), &p.payout))
        .collect();
    let by_id: HashMap<i64, &PayoutRow> = payouts.iter().map(|p| (p.payout.id, &p.payout)).collect();
    let mut claims: HashMap<i64, Vec<&Payment>> = HashMap::new();
    let mut loose: HashMap<(String, &str), Vec<&Payment>> = HashMap::new();
    for payment in payments.iter().filter(|p| !p.status.is_unpaid_ending()) {
        let by_its_key = by_key.get(payment.idempotency_key.as_str()).map(|p| p.id);
        // A payout's provider key is its payments' reference (its id, for
        // withdrawals keyed by id before the keys came from requests).
        let by_reference = payment.reference.as_deref().and_then(|r| {
            by_key.get(r).map(|p| p.id).or_else(|| {
                r.parse::<i64>()
                    .ok()
                    .filter(|id| by_id.get(id).is_some_and(|p| p.kind == PayoutKind::Withdrawal))
            })
        });
        let mut claimed: Vec<i64> = by_its_key.into_iter().chain(by_reference).collect();
        claimed.dedup();
        for id in &claimed {
            claims.entry(*id).or_default().push(payment);
        }
        if let (true, Some(reference)) = (claimed.is_empty(), payment.reference.as_deref()) {
            loose
                .entry((payment.creator.to_ascii_lowercase(), reference))
                .or_default()
                .push(payment);
        }
    }
    let listed = |paid: &[&Payment]| {
        paid.iter()
            .map(|p| format!("{} under {} ({})", p.id, p.idempotency_key, p.status))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut found = Vec::new();
    for (id, paid) in claims.into_iter().filter(|(_, paid)| paid.len() > 1) {
        let payout = by_id[&id];
        found.push(Mismatch {
            kind: MismatchKind::PaidTwice,
            payout_id: Some(id),
            key: payout.provider_key.clone(),
            provider_ids: paid.iter().map(|p| p.id.clone()).collect(),
            detail: format!(
                "{} payments that have not failed or come back claim it (by key or by reference {id}): {}",
                paid.len(),
                listed(&paid)
            ),
        });
    }
    for ((creator, reference), paid) in loose.into_iter().filter(|(_, paid)| paid.len() > 1) {
        found.push(Mismatch {
            kind: MismatchKind::PaidTwice,
            payout_id: None,
            key: paid[0].idempotency_key.clone(),
            provider_ids: paid.iter().map(|p| p.id.clone()).collect(),
            detail: format!(
                "{} payments that have not failed or come back pay {creator} under reference {reference:?}: {}",
                paid.len(),
                listed(&paid)
            ),
        });
    }
    found
}
