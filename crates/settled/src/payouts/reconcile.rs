//! Reconciliation: settled's payouts against the provider's payments. One
//! comparison ([`compare`]) serves `settled reconcile`, `settled verify
//! --payouts --provider-url` and `settled verify --period --provider-url`.
//! It reads and reports; it never moves a payout (delivery, webhooks and
//! lookups do, through the state machine).
//!
//! A payment belongs to the payout whose provider key it was made under.
//! What settled says of a payout against what the provider says of its
//! payment ([`judge`]):
//!
//! | settled | provider | verdict |
//! |---|---|---|
//! | queued | any | in flight: delivery records the answer |
//! | sent | pending | agree |
//! | sent | paid, failed, returned | behind: a webhook or a lookup applies it |
//! | paid | paid | agree |
//! | paid | returned, failed (a return) | behind: a webhook or a lookup returns it |
//! | failed | failed, returned, or no payment (refused) | agree (nothing left for good) |
//! | returned | returned, failed | agree |
//! | sent, paid | no payment | missing at the provider |
//! | paid | pending | states disagree |
//! | failed, returned | pending, paid | states disagree (the funds were returned) |
//! | created, cancelled, expired | any payment | states disagree (never sent) |
//!
//! Apart from the provider: a queued withdrawal whose delivery job is a dead
//! letter (or missing) is stranded: its funds are held and nothing will
//! send it until `settled queues replay payout_delivery` does. A payout (or
//! a settlement item not yet recorded as one) whose key waits for an
//! operator is named apart: past the provider's key window the provider
//! could not say whether it holds its payment, and nothing is sent under it
//! until an operator checks (`key_window.rs`).
//!
//! A payout is paid twice when more than one payment that has not failed
//! or come back claims it: those under its key (a provider that forgot the
//! key and took a second request under it as new), and any whose reference
//! is its key or its id (delivery sends a payout's provider key as its
//! reference, or its id for payouts keyed by id).
//! Payments whose reference names no payout are paid twice when two that
//! have not failed share creator and reference.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use sqlx::PgConnection;

use super::word::same_amount;
use super::{row, PayoutKind, PayoutRow, PayoutState};
use crate::money::Amount;
use crate::period::Period;
use crate::provider::{payout_key, HttpProvider, Payment, PaymentStatus};
use crate::verify::{Check, MAX_OFFENDERS};

/// A payout as reconciliation reads it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PayoutRecord {
    /// The payout.
    #[sqlx(flatten)]
    pub payout: PayoutRow,
    /// For a queued payout that nothing will send: why (its delivery job
    /// is a dead letter, or gone). None while delivery will send it.
    pub stranded: Option<String>,
    /// Why its key waits for an operator, if it does.
    pub awaiting_operator: Option<String>,
}

/// Each way settled and the provider can disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MismatchKind {
    /// settled says sent or paid; the provider has no payment under its key.
    MissingAtProvider,
    /// A payment under a key that is no payout's.
    UnknownToSettled,
    /// The payment's amount is not the payout's.
    AmountDiffers,
    /// The payment pays another creator.
    CreatorDiffers,
    /// The states contradict each other (see the module's table).
    StatesDisagree,
    /// More than one payment that has not failed for one payout.
    PaidTwice,
    /// settled says queued, and nothing will send it: its delivery job is a
    /// dead letter (replay it), or it has none.
    Stranded,
    /// Its key is past the provider's key window and the provider could not
    /// say whether it holds the payment: nothing is sent until an operator
    /// checks.
    AwaitingOperator,
}

impl MismatchKind {
    /// Every kind, in report order.
    pub const ALL: [MismatchKind; 8] = [
        MismatchKind::MissingAtProvider,
        MismatchKind::UnknownToSettled,
        MismatchKind::AmountDiffers,
        MismatchKind::CreatorDiffers,
        MismatchKind::StatesDisagree,
        MismatchKind::PaidTwice,
        MismatchKind::Stranded,
        MismatchKind::AwaitingOperator,
    ];

    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            MismatchKind::MissingAtProvider => "missing_at_provider",
            MismatchKind::UnknownToSettled => "unknown_to_settled",
            MismatchKind::AmountDiffers => "amount_differs",
            MismatchKind::CreatorDiffers => "creator_differs",
            MismatchKind::StatesDisagree => "states_disagree",
            MismatchKind::PaidTwice => "paid_twice",
            MismatchKind::Stranded => "stranded",
            MismatchKind::AwaitingOperator => "awaiting_operator",
        }
    }

    /// The verify check that fails with this kind: its name and what it proves.
    fn check(self) -> (&'static str, &'static str) {
        match self {
            MismatchKind::MissingAtProvider => (
                "provider_has_every_sent_payout",
                "the provider has a payment under the key of every payout settled sent or paid",
            ),
            MismatchKind::UnknownToSettled => (
                "provider_paid_only_known_payouts",
                "every provider payment was made under the key of one of settled's payouts",
            ),
            MismatchKind::AmountDiffers => (
                "provider_amounts_match",
                "each provider payment is for its payout's amount",
            ),
            MismatchKind::CreatorDiffers => (
                "provider_creators_match",
                "each provider payment pays its payout's creator",
            ),
            MismatchKind::StatesDisagree => (
                "provider_states_agree",
                "no payment contradicts its payout's state (paid against failed or returned, or paid for a payout never sent)",
            ),
            MismatchKind::PaidTwice => (
                "provider_paid_each_payout_once",
                "no payout has more than one provider payment that has not failed or come back",
            ),
            MismatchKind::Stranded => (
                "queued_payouts_are_being_delivered",
                "every queued payout has a delivery job that will send it (none a dead letter or missing)",
            ),
            MismatchKind::AwaitingOperator => (
                "no_key_awaits_an_operator",
                "no payment key waits for an operator (past the provider's key window, the provider said whether it holds each payment)",
            ),
        }
    }
}

impl std::fmt::Display for MismatchKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One disagreement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// What kind.
    pub kind: MismatchKind,
    /// The payout, when one is concerned.
    pub payout_id: Option<i64>,
    /// The provider key (of the payout, or of the payment when no payout has it).
    pub key: String,
    /// The provider's payment ids concerned.
    pub provider_ids: Vec<String>,
    /// What differs, in words.
    pub detail: String,
}

/// A payout settled has not caught up on yet: no mismatch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lag {
    /// The payout.
    pub payout_id: i64,
    /// Its provider key.
    pub key: String,
    /// Its state in settled.
    pub state: PayoutState,
    /// The payment's status at the provider.
    pub provider_status: PaymentStatus,
}

/// The comparison's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Comparison {
    /// Payouts compared.
    pub payouts: usize,
    /// Provider payments compared.
    pub payments: usize,
    /// Payouts whose payment (or its absence) agrees.
    pub agreeing: usize,
    /// Every disagreement, by kind in [`MismatchKind::ALL`]'s order.
    pub mismatches: Vec<Mismatch>,
    /// Queued payouts the provider already has (delivery records its
    /// answer), and payouts made after settled was read.
    pub in_flight: Vec<Lag>,
    /// Sent payouts the provider has paid, failed or returned, and paid
    /// ones it has returned (a webhook, or the look-up of a long-sent or
    /// recently paid payout, applies it).
    pub behind: Vec<Lag>,
}

impl Comparison {
    /// True when nothing differs.
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty()
    }

    /// The mismatches of `kind`.
    pub fn of(&self, kind: MismatchKind) -> impl Iterator<Item = &Mismatch> {
        self.mismatches.iter().filter(move |m| m.kind == kind)
    }

    /// One verify check per mismatch kind, offenders named by payout and key.
    pub fn checks(&self) -> Vec<Check> {
        MismatchKind::ALL
            .into_iter()
            .map(|kind| {
                let (name, description) = kind.check();
                let offenders: Vec<String> = self.of(kind).map(Mismatch::describe).collect();
                Check {
                    name,
                    description,
                    ok: offenders.is_empty(),
                    violations: offenders.len() as i64,
                    offenders: offenders.into_iter().take(MAX_OFFENDERS as usize).collect(),
                }
            })
            .collect()
    }
}

impl Mismatch {
    /// `payout 12 (payout-12): detail`, or `key K: detail` without a payout.
    pub fn describe(&self) -> String {
        match self.payout_id {
            Some(id) => format!("payout {id} ({}): {}", self.key, self.detail),
            None => format!("key {}: {}", self.key, self.detail),
        }
    }
}

/// What settled's state and the provider's status say together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// They agree.
    Agree,
    /// Delivery has not recorded the provider's answer yet.
    InFlight,
    /// The provider's final word has not reached settled yet.
    Behind,
    /// They contradict each other.
    Disagree,
}

/// The module's table: settled's `state` against the provider's `status`
/// of the payment under the payout's key.
pub fn judge(state: PayoutState, status: PaymentStatus) -> Verdict {
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
pub fn compare(payouts: &[PayoutRecord], payments: &[Payment]) -> Comparison {
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

/// Which payouts are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every payout, and every payment the provider has.
    All,
    /// The settlement payouts of one period, and the payments under its
    /// settlement keys (`settled:PERIOD:`).
    Period(Period),
}

/// The payouts in `scope`, in one statement (one snapshot).
pub async fn load_payouts(conn: &mut PgConnection, scope: Scope) -> anyhow::Result<Vec<PayoutRecord>> {
    let period = match scope {
        Scope::All => None,
        Scope::Period(p) => Some(p.date()),
    };
    Ok(sqlx::query_as(&format!(
        "SELECT {},
                CASE WHEN p.status <> 'queued' OR p.kind <> 'withdrawal' THEN NULL
                     WHEN j.payout_id IS NULL THEN 'it has no delivery job'
                     WHEN j.status = 'failed' THEN 'its delivery job is a dead letter after '
                          || j.attempt || ' attempt(s) (' || coalesce(j.last_error, 'no error recorded')
                          || '); settled queues replay payout_delivery --key ' || p.id || ' sends it'
                     WHEN j.status IN ('settled', 'cancelled') THEN 'its delivery job is ' || j.status
                END AS stranded,
                k.awaiting_operator_detail AS awaiting_operator
         FROM settlement.payouts p LEFT JOIN settlement.payout_jobs j ON j.payout_id = p.id
         LEFT JOIN settlement.provider_keys k ON k.key = p.provider_key
         WHERE $1::date IS NULL OR (p.kind = 'settlement' AND p.period = $1::date)
         ORDER BY p.id",
        super::PAYOUT_COLUMNS
    ))
    .bind(period) // $1
    .fetch_all(conn)
    .await?)
}

/// Reads settled's payouts in `scope`, then every payment of the
/// provider's (in that order: a payout sent after settled was read is
/// still at the provider when it is listed), and compares them. A payment
/// whose key matched no payout is asked about again: a payout made after
/// the read is in flight, and a settlement of a reward that rounded to zero
/// (its ledger row is 0, and settled records no payout for it) pays nothing.
pub async fn reconcile(conn: &mut PgConnection, provider: &HttpProvider, scope: Scope) -> anyhow::Result<Comparison> {
    let payouts = load_payouts(conn, scope).await?;
    let mut payments = provider.list_all().await?;
    if let Scope::Period(period) = scope {
        let prefix = payout_key(period, "");
        payments.retain(|p| p.idempotency_key.starts_with(&prefix));
    }
    let mut comparison = compare(&payouts, &payments);
    explain_unknown(conn, &mut comparison, &payments).await?;
    awaiting_without_payout(conn, scope, &mut comparison).await?;
    Ok(comparison)
}

/// The keys in `scope` that wait for an operator and have no payout yet (a
/// settlement item paid before its payout row): named as mismatches too.
async fn awaiting_without_payout(conn: &mut PgConnection, scope: Scope, out: &mut Comparison) -> anyhow::Result<()> {
    let prefix = match scope {
        Scope::All => String::new(),
        Scope::Period(period) => payout_key(period, ""),
    };
    let keys: Vec<(String, String)> = sqlx::query_as(
        "SELECT k.key, k.awaiting_operator_detail FROM settlement.provider_keys k
         WHERE k.awaiting_operator_since IS NOT NULL AND starts_with(k.key, $1)
           AND NOT EXISTS (SELECT 1 FROM settlement.payouts p WHERE p.provider_key = k.key)
         ORDER BY k.key",
    )
    .bind(&prefix) // $1
    .fetch_all(&mut *conn)
    .await?;
    for (key, why) in keys {
        out.mismatches.push(Mismatch {
            kind: MismatchKind::AwaitingOperator,
            payout_id: None,
            detail: format!("nothing is sent under this key until an operator checks: {why}"),
            key,
            provider_ids: Vec::new(),
        });
    }
    Ok(())
}

/// Takes out of the unknown payments those made for payouts that came
/// after the read (in flight) and those paying a zero reward.
async fn explain_unknown(conn: &mut PgConnection, out: &mut Comparison, payments: &[Payment]) -> anyhow::Result<()> {
    let unknown: Vec<String> = out.of(MismatchKind::UnknownToSettled).map(|m| m.key.clone()).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let made_since = row::load_by_provider_keys(conn, &unknown).await?;
    let (mut periods, mut creators, mut keys) = (Vec::new(), Vec::new(), Vec::new());
    for key in &unknown {
        let Some((period, creator)) = key.strip_prefix("settled:").and_then(|rest| rest.split_once(':')) else {
            continue;
        };
        if let Ok(period) = Period::parse(period) {
            periods.push(period.date());
            creators.push(creator.to_string());
            keys.push(key.clone());
        }
    }
    let zero: Vec<String> = sqlx::query_scalar(
        "SELECT k.key FROM unnest($1::date[], $2::text[], $3::text[]) AS k(period, creator, key)
         JOIN settlement.reward_ledger l ON l.period = k.period AND l.creator = k.creator
         WHERE l.amount = 0",
    )
    .bind(&periods) // $1
    .bind(&creators) // $2
    .bind(&keys) // $3
    .fetch_all(&mut *conn)
    .await?;
    let status_of: HashMap<&str, PaymentStatus> = payments
        .iter()
        .map(|p| (p.idempotency_key.as_str(), p.status))
        .collect();
    let zero_paid: HashSet<&str> = payments
        .iter()
        .filter(|p| same_amount(&p.amount, Amount::ZERO))
        .map(|p| p.idempotency_key.as_str())
        .collect();
    let mut explained: HashSet<String> = HashSet::new();
    for payout in made_since {
        if let Some(status) = status_of.get(payout.provider_key.as_str()) {
            out.in_flight.push(Lag {
                payout_id: payout.id,
                key: payout.provider_key.clone(),
                state: payout.state,
                provider_status: *status,
            });
            explained.insert(payout.provider_key);
        }
    }
    for key in zero.into_iter().filter(|k| zero_paid.contains(k.as_str())) {
        out.agreeing += 1;
        explained.insert(key);
    }
    out.mismatches
        .retain(|m| !(m.kind == MismatchKind::UnknownToSettled && explained.contains(&m.key)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
