//! The model itself: its initial state, each action's effect and the
//! properties checked.

use std::collections::BTreeSet;

use stateright::{Model, Property};

use super::{property, Action, Attempt, Chain, PayoutState, Pays, State, TxRow, TxState};

impl Chain {
    fn sign(&self, s: &mut State, p: u8) {
        let nonce = s.next_nonce;
        s.next_nonce += 1;
        let attempt = s.attempts.len() as u8;
        s.attempts.push(Attempt {
            nonce,
            pays: Pays::Payout(p),
            replacement: false,
        });
        if self.guards.write_ahead {
            s.txs.push(TxRow {
                nonce,
                payout: p,
                state: TxState::Signed,
                tracked: vec![attempt],
                given_up: false,
            });
        } else {
            s.unrecorded = Some(attempt);
        }
    }

    /// The node takes an attempt whose nonce is not used yet.
    fn send(s: &mut State, a: u8) {
        if (s.attempts[a as usize].nonce as usize) >= Chain::chain_nonce(s) {
            s.pool.insert(a);
        }
    }

    fn sign_more(s: &mut State, t: usize, pays: Pays, only_latest: bool) -> u8 {
        let attempt = s.attempts.len() as u8;
        s.attempts.push(Attempt {
            nonce: s.txs[t].nonce,
            pays,
            replacement: matches!(pays, Pays::Payout(_)),
        });
        if only_latest {
            s.txs[t].tracked = vec![attempt];
        } else {
            s.txs[t].tracked.push(attempt);
        }
        Chain::send(s, attempt);
        attempt
    }
}

impl Model for Chain {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            payouts: vec![PayoutState::Queued; self.payouts as usize],
            next_nonce: 0,
            txs: Vec::new(),
            attempts: Vec::new(),
            unrecorded: None,
            pool: BTreeSet::new(),
            chain: Vec::new(),
            budget: self.faults,
            reorged: false,
            replacement_mined: false,
            filler_confirmed: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.deliverer_actions(state, actions);
        self.node_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::Sign(p) => self.sign(&mut s, p),
            Action::Broadcast(a) => Chain::send(&mut s, a),
            Action::Record => {
                let a = s.unrecorded.take().expect("an unrecorded attempt");
                let Pays::Payout(p) = s.attempts[a as usize].pays else {
                    unreachable!("only transfers go unrecorded")
                };
                s.txs.push(TxRow {
                    nonce: s.attempts[a as usize].nonce,
                    payout: p,
                    state: TxState::Broadcast,
                    tracked: vec![a],
                    given_up: false,
                });
                s.payouts[p as usize] = PayoutState::Sent;
            }
            Action::MarkSent(t) => {
                let tx = &mut s.txs[t as usize];
                tx.state = TxState::Broadcast;
                s.payouts[tx.payout as usize] = PayoutState::Sent;
            }
            Action::Mine(a) => {
                let nonce = s.attempts[a as usize].nonce;
                let attempts = s.attempts.clone();
                s.pool.retain(|&other| attempts[other as usize].nonce != nonce);
                s.chain.push(Some(a));
                s.replacement_mined |= s.attempts[a as usize].replacement;
            }
            Action::MineEmpty => s.chain.push(None),
            Action::Drop(a) => {
                s.pool.remove(&a);
                s.budget.drops -= 1;
            }
            Action::Reorg => {
                let gone = s.chain.pop().expect("a block");
                s.budget.reorgs -= 1;
                s.reorged |= gone.is_some_and(|gone| s.txs.iter().any(|t| t.tracked.contains(&gone)));
            }
            Action::Replace(t) => {
                s.budget.replacements -= 1;
                let p = s.txs[t as usize].payout;
                Chain::sign_more(&mut s, t as usize, Pays::Payout(p), !self.guards.every_attempt);
            }
            Action::GiveUp(t) => {
                s.budget.give_ups -= 1;
                // The filler is an attempt of the same nonce: whichever the
                // node mines, the other can never be.
                Chain::sign_more(&mut s, t as usize, Pays::Nothing, false);
                s.txs[t as usize].given_up = true;
                if !self.guards.filler_confirmed {
                    s.txs[t as usize].state = TxState::Abandoned;
                    let p = s.txs[t as usize].payout;
                    s.payouts[p as usize] = PayoutState::Queued;
                }
            }
            Action::Include(t) => {
                let (block, _) = Chain::mined_attempt(&s, t as usize).expect("a mined attempt");
                s.txs[t as usize].state = TxState::Included(block);
            }
            Action::Reorged(t) => s.txs[t as usize].state = TxState::Broadcast,
            Action::NonceTaken(t) => {
                let tx = &mut s.txs[t as usize];
                tx.state = TxState::Abandoned;
                s.payouts[tx.payout as usize] = PayoutState::Queued;
            }
            Action::Confirm(t) => {
                let (_, mined) = Chain::mined_attempt(&s, t as usize).expect("an included attempt");
                let tx = &mut s.txs[t as usize];
                match s.attempts[mined as usize].pays {
                    Pays::Payout(p) => {
                        tx.state = TxState::Confirmed;
                        s.payouts[p as usize] = PayoutState::Paid;
                    }
                    Pays::Nothing => {
                        tx.state = TxState::Filled;
                        s.payouts[tx.payout as usize] = PayoutState::Queued;
                        s.filler_confirmed = true;
                    }
                }
            }
            Action::Crash => {
                s.budget.crashes -= 1;
                s.unrecorded = None;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(property::PAID_AT_MOST_ONCE, |m: &Chain, s: &State| {
                (0..m.payouts).all(|p| Chain::transfers(s, p) <= 1)
            }),
            Property::always(property::PAID_IS_ON_CHAIN, |m: &Chain, s: &State| {
                (0..m.payouts).all(|p| s.payouts[p as usize] != PayoutState::Paid || Chain::transfers(s, p) == 1)
            }),
            Property::eventually(property::EVERY_PAYOUT_PAID, |m: &Chain, s: &State| m.all_paid(s)),
            Property::sometimes("a replacement is mined instead of the original", |_, s: &State| {
                s.replacement_mined
            }),
            Property::sometimes(
                "a payout is paid after a reorg took its block",
                |m: &Chain, s: &State| s.reorged && m.all_paid(s),
            ),
            Property::sometimes(
                "a filler is confirmed and the payout paid under a new nonce",
                |m: &Chain, s: &State| s.filler_confirmed && m.all_paid(s),
            ),
        ]
    }
}
