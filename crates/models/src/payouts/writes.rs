//! A payout's state written: the conditional update, or its read and blind
//! write when that guard is removed, with the triggers and keys behind it.

use super::state::PayoutState::Queued;
use super::state::{allowed_from, Intent, Payment, PayoutState, Source, State, Written};
use super::Payouts;

impl Payouts {
    /// The provider's payment for a payout's key (the latest, when each
    /// attempt has a key of its own).
    pub(super) fn payment_of(state: &State, payout: u8) -> Option<Payment> {
        state.payments.iter().rfind(|p| p.payout == payout).copied()
    }

    /// A request has its answer: a payout, or a refusal.
    pub(super) fn answered(state: &State, request: u8) -> bool {
        state.requests[request as usize].refused || state.payouts.iter().any(|p| p.request == request)
    }

    /// A move and what commits with it: the return (the trigger
    /// `record_payout_transition`: a `payout_returns` row and the credit),
    /// or the delivery job (`INSERT INTO payout_jobs .. ON CONFLICT
    /// (payout_id) DO NOTHING`).
    pub(super) fn apply(s: &mut State, payout: u8, to: PayoutState) {
        let row = &mut s.payouts[payout as usize];
        row.state = to;
        if to.returns_funds() {
            row.returned += 1;
            s.balance += 1;
        }
        if to == Queued {
            s.enqueue(payout);
        }
    }

    /// The write of a payout's state: `move_payout(id, from, to)` with the
    /// guard; else a blind `UPDATE .. SET status = $to WHERE id = $1`, as
    /// the trigger and the return's key let it.
    pub(super) fn write(&self, s: &mut State, payout: u8, from: &[PayoutState], to: PayoutState) -> Written {
        let row = s.payouts[payout as usize];
        if self.guards.state_condition {
            if !from.contains(&row.state) {
                return Written::NotMoved;
            }
        } else if row.state == to {
            return Written::Unchanged;
        } else {
            // The trigger raises for a move the table does not list; the
            // return's primary key for a second return.
            let unlisted = self.guards.transition_table && !allowed_from(to).contains(&row.state);
            let returned_again = to.returns_funds() && self.guards.one_return && row.returned > 0;
            if unlisted || returned_again {
                return Written::Refused;
            }
        }
        Self::apply(s, payout, to);
        Written::Moved
    }

    /// The transaction of `source` around its write of `to`.
    pub(super) fn commit(&self, s: &mut State, payout: u8, from: &[PayoutState], to: PayoutState, source: Source) {
        match source {
            Source::Webhook(event) => {
                if self.guards.event_id && s.events[event as usize] > 0 {
                    return; // the insert finds the event: rolled back, answered 200
                }
                if self.write(s, payout, from, to) == Written::Refused {
                    // Answered 5xx: the provider sends the event again.
                    s.inflight.push(event);
                    s.inflight.sort();
                } else {
                    s.events[event as usize] += 1;
                }
            }
            Source::Confirm => {
                let row = s.payouts[payout as usize];
                if row.token_expired || (self.guards.one_time_token && row.confirmed > 0) {
                    return; // redeem_in answered false: rolled back
                }
                if matches!(self.write(s, payout, from, to), Written::Moved | Written::Unchanged) {
                    s.payouts[payout as usize].confirmed += 1;
                }
            }
            _ => {
                self.write(s, payout, from, to);
            }
        }
    }

    /// A transition from one of `from` to `to` by `source`: with the guard,
    /// its transaction now; without, its read (an intent to write, when the
    /// state read is one of `from`).
    pub(super) fn decide(&self, s: &mut State, payout: u8, from: &[PayoutState], to: PayoutState, source: Source) {
        if self.guards.state_condition {
            return self.commit(s, payout, from, to, source);
        }
        if from.contains(&s.payouts[payout as usize].state) {
            s.intents.push(Intent { payout, to, source });
            s.intents.sort();
        } else if let Source::Webhook(event) = source {
            // Nothing to move: the event is stored, as `already`.
            if !(self.guards.event_id && s.events[event as usize] > 0) {
                s.events[event as usize] += 1;
            }
        }
    }

    /// A source may read again only once its earlier read is written.
    pub(super) fn reading(state: &State, payout: u8, source: Source) -> bool {
        state.intents.iter().any(|i| i.payout == payout && i.source == source)
    }
}
