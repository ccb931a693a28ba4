//! The provider's word: what a rail's answer about a payout's payment
//! means for the payout, in one table (`read`). A payment under the
//! payout's key that pays what the payout pays is a [`ProviderWord`]
//! (pending, paid, failed or returned), which asks the state machine for
//! its [`Moves`]; a payment that is not the payout's, a refusal, a key
//! used for another request, a rate limit and an unknown outcome each read
//! as their own `Reading`. Webhook events read the same way
//! (`word_of_event`). The database applies a word
//! (`settlement.apply_provider_word`, along its table
//! `settlement.provider_word_moves`, which [`ProviderWord::moves`] is
//! pinned to) from the payout's state at that moment: this module decides
//! nothing from a state read earlier, and it never writes.

use std::time::Duration;

use super::{PayoutRow, PayoutState};
use crate::money::Amount;
use crate::provider::{EventType, Payment, PaymentStatus, ProviderError, WebhookEvent};

/// What the provider says of a payment, from any source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderWord {
    /// Accepted, not paid yet.
    Pending {
        /// The provider's id.
        provider_id: String,
    },
    /// Paid.
    Paid {
        /// The provider's id.
        provider_id: String,
    },
    /// Failed after acceptance, or refused; of a paid payment, a return
    /// (a provider without a returned status).
    Failed {
        /// The provider's id, when it has one.
        provider_id: Option<String>,
        /// Why.
        reason: String,
    },
    /// Paid, then returned (the money came back to the provider).
    Returned {
        /// The provider's id.
        provider_id: String,
        /// Why.
        reason: String,
    },
}

/// One move a word asks of the state machine: a payout in `from` goes to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The state it moves a payout from.
    pub from: PayoutState,
    /// The state it moves it to.
    pub to: PayoutState,
}

/// The moves a word asks of the state machine, at most one from each
/// state. A payout in a state none of them starts from does not move (the
/// database answers `already`, or records a conflict when the word
/// contradicts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moves(pub &'static [Move]);

impl Moves {
    /// Where a payout in `state` goes, if it moves.
    pub fn from(self, state: PayoutState) -> Option<PayoutState> {
        self.0.iter().find(|m| m.from == state).map(|m| m.to)
    }
}

const fn to(from: PayoutState, to: PayoutState) -> Move {
    Move { from, to }
}

use PayoutState::{Failed as F, Paid as P, Queued as Q, Returned as R, Sent as S};

/// What a refusal asks: a queued payout fails, and its funds come back
/// (`settlement.fail_refused_payout`).
pub const REFUSAL: Moves = Moves(&[to(Q, F)]);

/// The table: the moves of each word (`settlement.provider_word_moves`).
const PENDING_MOVES: Moves = Moves(&[to(Q, S)]);
const PAID_MOVES: Moves = Moves(&[to(Q, P), to(S, P)]);
/// `failed` after `paid` is a return: the provider has no returned status.
const FAILED_MOVES: Moves = Moves(&[to(Q, F), to(S, F), to(P, R)]);
/// A return that comes before its `paid` was heard moves a queued or sent
/// payout straight to returned.
const RETURNED_MOVES: Moves = Moves(&[to(Q, R), to(S, R), to(P, R)]);

impl ProviderWord {
    /// The status `settlement.apply_provider_word` takes: `pending`,
    /// `paid`, `failed` or `returned`.
    pub(crate) fn provider_status(&self) -> &'static str {
        match self {
            ProviderWord::Pending { .. } => PaymentStatus::Pending.as_str(),
            ProviderWord::Paid { .. } => PaymentStatus::Paid.as_str(),
            ProviderWord::Failed { .. } => PaymentStatus::Failed.as_str(),
            ProviderWord::Returned { .. } => PaymentStatus::Returned.as_str(),
        }
    }

    /// The payment it is about, when the provider named one.
    pub(crate) fn provider_id(&self) -> Option<&str> {
        match self {
            ProviderWord::Pending { provider_id }
            | ProviderWord::Paid { provider_id }
            | ProviderWord::Returned { provider_id, .. } => Some(provider_id),
            ProviderWord::Failed { provider_id, .. } => provider_id.as_deref(),
        }
    }

    /// The moves it asks of the state machine (`settlement.apply_provider_word`
    /// makes them; a test pins this table to `settlement.provider_word_moves`).
    pub fn moves(&self) -> Moves {
        match self {
            ProviderWord::Pending { .. } => PENDING_MOVES,
            ProviderWord::Paid { .. } => PAID_MOVES,
            ProviderWord::Failed { .. } => FAILED_MOVES,
            ProviderWord::Returned { .. } => RETURNED_MOVES,
        }
    }

    /// Every word's status and moves, for the pin against the database.
    pub fn table() -> [(&'static str, Moves); 4] {
        [
            (PaymentStatus::Pending.as_str(), PENDING_MOVES),
            (PaymentStatus::Paid.as_str(), PAID_MOVES),
            (PaymentStatus::Failed.as_str(), FAILED_MOVES),
            (PaymentStatus::Returned.as_str(), RETURNED_MOVES),
        ]
    }
}

/// The provider's payment as the payout state machine's word.
pub fn word_of(payment: &Payment) -> ProviderWord {
    match payment.status {
        PaymentStatus::Pending => ProviderWord::Pending {
            provider_id: payment.id.clone(),
        },
        PaymentStatus::Paid => ProviderWord::Paid {
            provider_id: payment.id.clone(),
        },
        PaymentStatus::Failed => ProviderWord::Failed {
            provider_id: Some(payment.id.clone()),
            reason: payment
                .failure_reason
                .clone()
                .unwrap_or_else(|| "no reason given".into()),
        },
        PaymentStatus::Returned => ProviderWord::Returned {
            provider_id: payment.id.clone(),
            reason: payment
                .failure_reason
                .clone()
                .unwrap_or_else(|| "no reason given".into()),
        },
    }
}

/// What a webhook event says: its type, whatever status its payment
/// carries (the event names the final state the payment reached).
pub(crate) fn word_of_event(event: &WebhookEvent) -> ProviderWord {
    match event.r#type {
        EventType::PaymentPaid => ProviderWord::Paid {
            provider_id: event.data.id.clone(),
        },
        EventType::PaymentFailed => match word_of(&event.data) {
            failed @ ProviderWord::Failed { .. } => failed,
            _ => ProviderWord::Failed {
                provider_id: Some(event.data.id.clone()),
                reason: "the provider's event says failed".into(),
            },
        },
        EventType::PaymentReturned => match word_of(&event.data) {
            returned @ ProviderWord::Returned { .. } => returned,
            _ => ProviderWord::Returned {
                provider_id: event.data.id.clone(),
                reason: "the provider's event says returned".into(),
            },
        },
    }
}

/// True when the provider's `amount` text is exactly `amount` ("007" is 7;
/// anything that is not a whole amount is not).
pub(crate) fn same_amount(text: &str, amount: Amount) -> bool {
    Amount::parse_decimal(text) == Ok(amount)
}

/// What differs between `payout` and the provider's `payment` given for
/// its key, in words; None when the payment is under that key and pays
/// exactly that amount to that creator.
pub(crate) fn differs(payout: &PayoutRow, payment: &Payment) -> Option<String> {
    let (key, amount, creator) = (&payout.provider_key, payout.amount, &payout.creator);
    if payment.idempotency_key != *key {
        return Some(format!(
            "the provider answered for the payout's key {key:?} with its payment {:?} under another key {:?}",
            payment.id, payment.idempotency_key
        ));
    }
    let amount_differs = !same_amount(&payment.amount, amount);
    let creator_differs = !creator.as_str().eq_ignore_ascii_case(&payment.creator);
    (amount_differs || creator_differs).then(|| {
        format!(
            "the payout pays {amount} to {creator}, the provider's payment {} under its key pays {} to {}",
            payment.id, payment.amount, payment.creator
        )
    })
}

/// A rail's answer to sending a payout, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reading {
    /// The payout's payment, in the provider's word: the payout moves by it
    /// ([`ProviderWord::moves`]) once its payment id clashes with no other
    /// payout's.
    Word(ProviderWord),
    /// The rail will never pay this request (a 4xx): [`REFUSAL`].
    Refused(String),
    /// The answer is another payment (another key, creator or amount):
    /// nothing moves, the funds stay held; a conflict for operators.
    NotItsPayment {
        /// The payment the rail answered with.
        payment: Payment,
        /// What differs, in words.
        detail: String,
    },
    /// The rail has the payout's key for a different request (422):
    /// nothing moves; an operator must look.
    KeyConflict(String),
    /// Not now: the rail asked to wait this long. Nothing moves.
    RateLimited(Duration),
    /// No answer (a timeout, a 5xx, a broken connection): the payment may
    /// or may not exist. Nothing moves; it is sent again under the same key.
    Unavailable(String),
}

impl Reading {
    /// The moves it asks of the state machine, if any.
    #[cfg(test)]
    pub(crate) fn moves(&self) -> Option<Moves> {
        match self {
            Reading::Word(word) => Some(word.moves()),
            Reading::Refused(_) => Some(REFUSAL),
            Reading::NotItsPayment { .. }
            | Reading::KeyConflict(_)
            | Reading::RateLimited(_)
            | Reading::Unavailable(_) => None,
        }
    }
}

/// The table: a rail's `answer` to sending `payout`, read.
pub(crate) fn read(payout: &PayoutRow, answer: Result<Payment, ProviderError>) -> Reading {
    match answer {
        Ok(payment) => match differs(payout, &payment) {
            Some(detail) => Reading::NotItsPayment { payment, detail },
            None => Reading::Word(word_of(&payment)),
        },
        Err(ProviderError::Refused(why)) => Reading::Refused(why),
        Err(ProviderError::KeyConflict(why)) => Reading::KeyConflict(why),
        Err(ProviderError::RateLimited { retry_after }) => Reading::RateLimited(retry_after),
        Err(ProviderError::Transient(why)) => Reading::Unavailable(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::CreatorAddress;
    use crate::payouts::PayoutKind;
    use PayoutState::Queued;

    const CREATOR: &str = "0x00000000000000000000000000000000000000aa";

    fn payout() -> PayoutRow {
        PayoutRow {
            id: 7,
            kind: PayoutKind::Withdrawal,
            creator: CreatorAddress::parse(CREATOR).unwrap(),
            amount: Amount::parse_decimal("1000").unwrap(),
            state: Queued,
            provider_key: "withdrawal-k".into(),
            reference: "withdrawal-k".into(),
            idempotency_key: Some("k".into()),
            provider_id: None,
        }
    }

    fn payment(status: PaymentStatus) -> Payment {
        Payment {
            id: "pay_1".into(),
            idempotency_key: "withdrawal-k".into(),
            creator: CREATOR.into(),
            amount: "1000".into(),
            status,
            failure_reason: matches!(status, PaymentStatus::Failed | PaymentStatus::Returned)
                .then(|| "account closed".into()),
            reference: Some("withdrawal-k".into()),
        }
    }

    #[test]
    fn every_answer_of_a_rail_reads_as_one_move_or_none() {
        let pay = |s| read(&payout(), Ok(payment(s)));
        let table: [(Reading, Reading, Option<Moves>); 8] = [
            (
                pay(PaymentStatus::Pending),
                Reading::Word(ProviderWord::Pending {
                    provider_id: "pay_1".into(),
                }),
                Some(PENDING_MOVES),
            ),
            (
                pay(PaymentStatus::Paid),
                Reading::Word(ProviderWord::Paid {
                    provider_id: "pay_1".into(),
                }),
                Some(PAID_MOVES),
            ),
            (
                pay(PaymentStatus::Failed),
                Reading::Word(ProviderWord::Failed {
                    provider_id: Some("pay_1".into()),
                    reason: "account closed".into(),
                }),
                Some(FAILED_MOVES),
            ),
            (
                pay(PaymentStatus::Returned),
                Reading::Word(ProviderWord::Returned {
                    provider_id: "pay_1".into(),
                    reason: "account closed".into(),
                }),
                Some(RETURNED_MOVES),
            ),
            (
                read(&payout(), Err(ProviderError::Refused("400: bad creator".into()))),
                Reading::Refused("400: bad creator".into()),
                Some(REFUSAL),
            ),
            (
                read(&payout(), Err(ProviderError::KeyConflict("422".into()))),
                Reading::KeyConflict("422".into()),
                None,
            ),
            (
                read(
                    &payout(),
                    Err(ProviderError::RateLimited {
                        retry_after: Duration::from_secs(3),
                    }),
                ),
                Reading::RateLimited(Duration::from_secs(3)),
                None,
            ),
            (
                read(&payout(), Err(ProviderError::Transient("timed out".into()))),
                Reading::Unavailable("timed out".into()),
                None,
            ),
        ];
        for (read, expected, moves) in table {
            assert_eq!(read, expected);
            assert_eq!(read.moves(), moves, "{read:?}");
        }
    }

    #[test]
    fn a_word_names_its_status_and_payment() {
        for status in PaymentStatus::ALL {
            let word = word_of(&payment(status));
            assert_eq!(word.provider_status(), status.as_str());
            assert_eq!(word.provider_id(), Some("pay_1"));
        }
        let unnamed = ProviderWord::Failed {
            provider_id: None,
            reason: "refused".into(),
        };
        assert_eq!(unnamed.provider_id(), None);
        let no_reason = Payment {
            failure_reason: None,
            ..payment(PaymentStatus::Failed)
        };
        assert!(matches!(word_of(&no_reason), ProviderWord::Failed { reason, .. } if reason == "no reason given"));
    }

    #[test]
    fn a_payment_under_another_key_or_paying_otherwise_is_not_the_payouts() {
        type Change = fn(&mut Payment);
        let cases: [(Change, &str); 4] = [
            (|p| p.idempotency_key = "other".into(), "under another key"),
            (|p| p.amount = "1001".into(), "pays 1001 to"),
            (|p| p.amount = "1e3".into(), "pays 1e3 to"),
            (
                |p| p.creator = "0x00000000000000000000000000000000000000bb".into(),
                "to 0x",
            ),
        ];
        for (change, says) in cases {
            let mut other = payment(PaymentStatus::Paid);
            change(&mut other);
            match read(&payout(), Ok(other.clone())) {
                Reading::NotItsPayment { payment, detail } => {
                    assert_eq!(payment, other);
                    assert!(detail.contains(says), "{detail}");
                }
                read => panic!("{other:?} read as {read:?}"),
            }
        }
        // Leading zeros and a checksummed creator are the same payment.
        let same = Payment {
            amount: "0001000".into(),
            creator: CREATOR.to_ascii_uppercase().replacen("0X", "0x", 1),
            ..payment(PaymentStatus::Paid)
        };
        assert!(matches!(
            read(&payout(), Ok(same)),
            Reading::Word(ProviderWord::Paid { .. })
        ));
    }

    #[test]
    fn a_webhook_event_says_what_its_type_says() {
        let event = |r#type, status| WebhookEvent {
            id: "evt_1".into(),
            r#type,
            created: 0,
            data: payment(status),
        };
        assert_eq!(
            word_of_event(&event(EventType::PaymentPaid, PaymentStatus::Pending)),
            ProviderWord::Paid {
                provider_id: "pay_1".into()
            }
        );
        assert_eq!(
            word_of_event(&event(EventType::PaymentFailed, PaymentStatus::Failed)),
            ProviderWord::Failed {
                provider_id: Some("pay_1".into()),
                reason: "account closed".into()
            }
        );
        assert_eq!(
            word_of_event(&event(EventType::PaymentFailed, PaymentStatus::Paid)),
            ProviderWord::Failed {
                provider_id: Some("pay_1".into()),
                reason: "the provider's event says failed".into()
            }
        );
        assert_eq!(
            word_of_event(&event(EventType::PaymentReturned, PaymentStatus::Returned)),
            ProviderWord::Returned {
                provider_id: "pay_1".into(),
                reason: "account closed".into()
            }
        );
        assert_eq!(
            word_of_event(&event(EventType::PaymentReturned, PaymentStatus::Paid)),
            ProviderWord::Returned {
                provider_id: "pay_1".into(),
                reason: "the provider's event says returned".into()
            }
        );
    }

    #[test]
    fn failed_after_paid_is_a_return_and_a_return_never_comes_back() {
        let failed = word_of(&payment(PaymentStatus::Failed)).moves();
        assert_eq!(failed.from(PayoutState::Paid), Some(PayoutState::Returned));
        assert_eq!(failed.from(PayoutState::Sent), Some(PayoutState::Failed));
        for word in ProviderWord::table().map(|(_, moves)| moves) {
            for state in [PayoutState::Returned, PayoutState::Failed, PayoutState::Cancelled] {
                assert_eq!(word.from(state), None, "{state} never moves again");
            }
        }
    }
}
