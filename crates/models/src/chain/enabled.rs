//! What may happen next in a state: the deliverer's and the node's enabled
//! actions, and the queries over the state they and the properties use.

use super::{Action, Chain, PayoutState, Pays, State, TxState};

impl Chain {
    /// The transaction of payout `p` that may still pay it.
    pub(super) fn live_tx(s: &State, p: u8) -> Option<usize> {
        s.txs
            .iter()
            .position(|t| t.payout == p && !matches!(t.state, TxState::Abandoned | TxState::Filled))
    }

    /// Canonical transfers of payout `p`.
    pub(super) fn transfers(s: &State, p: u8) -> usize {
        s.chain
            .iter()
            .flatten()
            .filter(|&&a| s.attempts[a as usize].pays == Pays::Payout(p))
            .count()
    }

    /// The sender's nonce on the chain: its transactions mined.
    pub(super) fn chain_nonce(s: &State) -> usize {
        s.chain.iter().flatten().count()
    }

    /// Where a tracked attempt of tx `t` is in the canonical chain: its
    /// block and the attempt.
    pub(super) fn mined_attempt(s: &State, t: usize) -> Option<(u8, u8)> {
        let tx = &s.txs[t];
        s.chain
            .iter()
            .enumerate()
            .find_map(|(b, a)| a.filter(|a| tx.tracked.contains(a)).map(|a| (b as u8, a)))
    }

    pub(super) fn deliverer_actions(&self, s: &State, actions: &mut Vec<Action>) {
        for p in 0..self.payouts {
            if s.payouts[p as usize] == PayoutState::Queued && Chain::live_tx(s, p).is_none() && s.unrecorded.is_none()
            {
                actions.push(Action::Sign(p));
            }
        }
        let nonce = Chain::chain_nonce(s);
        let on_chain = |a: u8| s.chain.contains(&Some(a));
        if let Some(a) = s.unrecorded {
            if !s.pool.contains(&a) && (s.attempts[a as usize].nonce as usize) >= nonce {
                actions.push(Action::Broadcast(a));
            }
            if s.pool.contains(&a) || on_chain(a) {
                actions.push(Action::Record);
            }
        }
        for (t, tx) in s.txs.iter().enumerate() {
            let t8 = t as u8;
            match tx.state {
                TxState::Signed | TxState::Broadcast => {
                    // Sent again after any doubt: every attempt the node
                    // no longer holds, while its nonce is free.
                    if (tx.nonce as usize) >= nonce {
                        for &a in &tx.tracked {
                            if !s.pool.contains(&a) {
                                actions.push(Action::Broadcast(a));
                            }
                        }
                    }
                    if tx.state == TxState::Signed && tx.tracked.iter().any(|&a| s.pool.contains(&a) || on_chain(a)) {
                        actions.push(Action::MarkSent(t8));
                    }
                    if tx.state == TxState::Broadcast {
                        if Chain::mined_attempt(s, t).is_some() {
                            actions.push(Action::Include(t8));
                        } else if (tx.nonce as usize) < nonce {
                            actions.push(Action::NonceTaken(t8));
                        } else {
                            if s.budget.replacements > 0 && !tx.given_up {
                                actions.push(Action::Replace(t8));
                            }
                            if s.budget.give_ups > 0 && !tx.given_up {
                                actions.push(Action::GiveUp(t8));
                            }
                        }
                    }
                }
                TxState::Included(block) => match Chain::mined_attempt(s, t) {
                    Some((b, _)) if b == block => {
                        if s.chain.len() - block as usize >= self.depth() {
                            actions.push(Action::Confirm(t8));
                        }
                    }
                    _ => actions.push(Action::Reorged(t8)),
                },
                TxState::Confirmed | TxState::Filled | TxState::Abandoned => {}
            }
        }
        if s.budget.crashes > 0 {
            actions.push(Action::Crash);
        }
    }

    pub(super) fn node_actions(&self, s: &State, actions: &mut Vec<Action>) {
        let nonce = Chain::chain_nonce(s);
        for &a in &s.pool {
            if s.attempts[a as usize].nonce as usize == nonce {
                actions.push(Action::Mine(a));
            }
            if s.budget.drops > 0 {
                actions.push(Action::Drop(a));
            }
        }
        if s.budget.reorgs > 0 && !s.chain.is_empty() {
            actions.push(Action::Reorg);
        }
        // Others' blocks come all the time; here only while one is needed
        // on top of an included transaction (which keeps behaviours finite).
        let waiting = s.txs.iter().any(|t| match t.state {
            TxState::Included(block) => s.chain.len() - (block as usize) < self.depth(),
            _ => false,
        });
        if waiting {
            actions.push(Action::MineEmpty);
        }
    }

    pub(super) fn all_paid(&self, s: &State) -> bool {
        (0..self.payouts).all(|p| s.payouts[p as usize] == PayoutState::Paid && Chain::transfers(s, p) == 1)
    }
}
