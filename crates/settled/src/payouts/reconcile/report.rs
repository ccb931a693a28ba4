//! What reconciliation reports: the payouts it reads, the kinds of mismatch,
//! the lags and the comparison that gathers them, and the verdicts.

use serde::Serialize;

use crate::payouts::{PayoutRow, PayoutState};
use crate::provider::PaymentStatus;
use crate::verify::{Check, MAX_OFFENDERS};

/// A payout as reconciliation reads it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct PayoutRecord {
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
pub(crate) enum MismatchKind {
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
    pub(crate) const ALL: [MismatchKind; 8] = [
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
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) struct Mismatch {
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
pub(crate) struct Lag {
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
pub(crate) struct Comparison {
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
    pub(crate) fn ok(&self) -> bool {
        self.mismatches.is_empty()
    }

    /// The mismatches of `kind`.
    pub(crate) fn of(&self, kind: MismatchKind) -> impl Iterator<Item = &Mismatch> {
        self.mismatches.iter().filter(move |m| m.kind == kind)
    }

    /// One verify check per mismatch kind, offenders named by payout and key.
    pub(crate) fn checks(&self) -> Vec<Check> {
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
    pub(crate) fn describe(&self) -> String {
        match self.payout_id {
            Some(id) => format!("payout {id} ({}): {}", self.key, self.detail),
            None => format!("key {}: {}", self.key, self.detail),
        }
    }
}

/// What settled's state and the provider's status say together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// They agree.
    Agree,
    /// Delivery has not recorded the provider's answer yet.
    InFlight,
    /// The provider's final word has not reached settled yet.
    Behind,
    /// They contradict each other.
    Disagree,
}
