//! The chain rail's model: a payout paid by an ERC-20 transfer from one hot
//! wallet, through write-ahead signing, broadcasts a node may forget,
//! replacements under the same nonce, reorgs, a nonce given up and filled,
//! and a deliverer killed anywhere.
//!
//! It models `crates/settled/src/chain/`: `sign.rs` (the next nonce taken
//! from `settlement.chain_senders` under its row lock, the transaction
//! signed and stored in `chain_txs` and `chain_tx_attempts` before it is
//! ever sent), `broadcast.rs` (the stored bytes sent, again after any
//! doubt), `confirm.rs` (following heads: inclusion by any of the
//! transaction's attempts' hashes, a block that left the canonical chain,
//! the confirmation depth) and the payout moves it makes through the
//! payout state machine. The node is a pool of signed attempts and one
//! canonical chain, one transaction a block, mined in nonce order; a
//! block that a reorg removes takes its transaction with it (the node
//! forgot it). Fees are not modelled: a replacement is an attempt under the
//! same nonce, and the node mines whichever attempt of a nonce it likes.
//!
//! The guards: the write-ahead row ([`Guards::write_ahead`]), every
//! attempt's hash kept ([`Guards::every_attempt`]), the confirmation depth
//! ([`Guards::depth`]) and the requeue only after the filler is confirmed
//! ([`Guards::filler_confirmed`]). Each guard-less variant pays twice or
//! leaves a paid payout unpaid (`tests/models.rs`).

use std::collections::BTreeSet;
use std::fmt;

use stateright::{Model, Property};

use crate::check::Described;

/// Faults, each at most this many times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// The deliverer killed (what it held in memory is lost; it restarts).
    pub crashes: u8,
    /// The node drops an attempt from its pool.
    pub drops: u8,
    /// A reorg of one block (fewer than the confirmation depth).
    pub reorgs: u8,
    /// A stuck transaction replaced under its nonce (fees raised).
    pub replacements: u8,
    /// A nonce given up: filled with a zero-value transaction to itself.
    pub give_ups: u8,
}

/// The guards a variant may go without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guards {
    /// The transaction and its attempt are stored, with the nonce taken
    /// under the sender row's lock, before the first broadcast (without:
    /// stored once the node took it, so a deliverer killed in between
    /// signs the payout again, under the next nonce).
    pub write_ahead: bool,
    /// Every attempt's hash is kept and looked for (without: only the
    /// latest, so a mined original reads as "nonce taken by another").
    pub every_attempt: bool,
    /// Paid at the confirmation depth, 2 here (without: at inclusion, depth 1).
    pub depth: bool,
    /// A given-up nonce's payouts are queued again only once its filler is
    /// confirmed (without: as soon as the filler is signed).
    pub filler_confirmed: bool,
}

impl Guards {
    /// Every guard the code has.
    pub const ALL: Guards = Guards {
        write_ahead: true,
        every_attempt: true,
        depth: true,
        filler_confirmed: true,
    };
}

/// The chain model at some bounds.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Payouts to pay, each to its own creator.
    pub payouts: u8,
    /// Faults.
    pub faults: Faults,
    /// The guards in force.
    pub guards: Guards,
}

/// `settlement.payouts.status`, as far as the chain rail moves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PayoutState {
    /// Waiting for a transaction.
    Queued,
    /// Its transaction was broadcast.
    Sent,
    /// Its transaction confirmed.
    Paid,
}

/// What an attempt does when mined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pays {
    /// `transfer(creator, amount)` of this payout.
    Payout(u8),
    /// The filler: zero value to the sender itself.
    Nothing,
}

/// A signed attempt (`chain_tx_attempts`: raw bytes and hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    /// Its nonce.
    pub nonce: u8,
    /// What it does.
    pub pays: Pays,
    /// A replacement of an earlier attempt of its transaction.
    pub replacement: bool,
}

/// `settlement.chain_txs.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TxState {
    /// Stored, not yet known to have reached the node.
    Signed,
    /// Sent to the node.
    Broadcast,
    /// One of its attempts is in the canonical chain, in this block.
    Included(u8),
    /// At the confirmation depth with its transfer: final, the payout paid.
    Confirmed,
    /// At the confirmation depth with its filler: final, the payout queued
    /// again for a new transaction.
    Filled,
    /// Its nonce was taken by an attempt it does not know: given up.
    Abandoned,
}

/// A row of `settlement.chain_txs` with its attempts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TxRow {
    /// Its nonce.
    pub nonce: u8,
    /// The payout it pays.
    pub payout: u8,
    /// Its state.
    pub state: TxState,
    /// The attempts whose hashes it keeps (ids into `State::attempts`).
    pub tracked: Vec<u8>,
    /// Given up: a filler was signed under its nonce.
    pub given_up: bool,
}

/// The model's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Each payout's state.
    pub payouts: Vec<PayoutState>,
    /// `chain_senders.next_nonce`.
    pub next_nonce: u8,
    /// `chain_txs`.
    pub txs: Vec<TxRow>,
    /// Every attempt ever signed (its bytes exist somewhere).
    pub attempts: Vec<Attempt>,
    /// Signed but not stored: the deliverer's memory (write-ahead off).
    pub unrecorded: Option<u8>,
    /// The node's pool: attempts it may mine.
    pub pool: BTreeSet<u8>,
    /// The canonical chain: the attempt mined in each block, if any.
    pub chain: Vec<Option<u8>>,
    /// Faults left.
    pub budget: Faults,
    /// A reorg took a block with a transaction (for `sometimes`).
    pub reorged: bool,
    /// A replacement was mined (for `sometimes`).
    pub replacement_mined: bool,
    /// A filler was confirmed (for `sometimes`).
    pub filler_confirmed: bool,
}

/// An action: the function it models in brackets in its display.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// `sign.rs`: the next nonce under the sender row's lock, a transfer
    /// of the payout signed (and, write-ahead, stored).
    Sign(u8),
    /// `broadcast.rs`: the attempt's bytes sent to the node.
    Broadcast(u8),
    /// Write-ahead off: the broadcast attempt stored, the payout sent.
    Record,
    /// `broadcast.rs`: a stored transaction marked broadcast, its payout sent.
    MarkSent(u8),
    /// The node mines an attempt of the next nonce.
    Mine(u8),
    /// The node mines a block without the sender's transactions.
    MineEmpty,
    /// The node drops an attempt from its pool.
    Drop(u8),
    /// A reorg removes the newest block.
    Reorg,
    /// A replacement attempt under the transaction's nonce, sent.
    Replace(u8),
    /// The transaction's nonce given up: a filler signed, stored and sent.
    GiveUp(u8),
    /// `confirm.rs`: one of its attempts is in the canonical chain.
    Include(u8),
    /// `confirm.rs`: its block left the canonical chain: broadcast again.
    Reorged(u8),
    /// `confirm.rs`: its nonce is taken and none of its attempts is there.
    NonceTaken(u8),
    /// `confirm.rs`: at the depth: the payout paid, or for a filler, the
    /// payout queued again.
    Confirm(u8),
    /// The deliverer killed and restarted.
    Crash,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Sign(p) => write!(f, "sign a transfer for payout {p} under the next nonce [sign.rs]"),
            Action::Broadcast(a) => write!(f, "send attempt {a}'s bytes to the node [broadcast.rs]"),
            Action::Record => write!(f, "store the attempt the node took, payout sent (no write-ahead)"),
            Action::MarkSent(t) => write!(f, "tx {t} broadcast, its payout sent [broadcast.rs]"),
            Action::Mine(a) => write!(f, "NODE mines attempt {a}"),
            Action::MineEmpty => write!(f, "NODE mines a block of others' transactions"),
            Action::Drop(a) => write!(f, "NODE drops attempt {a} from its pool"),
            Action::Reorg => write!(f, "REORG: the newest block leaves the canonical chain"),
            Action::Replace(t) => write!(f, "tx {t} stuck: a replacement under its nonce, sent"),
            Action::GiveUp(t) => write!(f, "tx {t}'s nonce given up: a filler signed and sent"),
            Action::Include(t) => write!(f, "tx {t} found in a block [confirm.rs]"),
            Action::Reorged(t) => write!(f, "tx {t}'s block left the chain: broadcast again [confirm.rs]"),
            Action::NonceTaken(t) => write!(
                f,
                "tx {t}'s nonce taken by an attempt it does not know: payout queued again"
            ),
            Action::Confirm(t) => write!(f, "tx {t} at the depth [confirm.rs]"),
            Action::Crash => write!(f, "SIGKILL the deliverer; it restarts"),
        }
    }
}

/// The properties' names.
pub mod property {
    /// Safety: never two transfers of one payout.
    pub const PAID_AT_MOST_ONCE: &str = "no payout has two transfers in the canonical chain";
    /// Safety: paid means on-chain.
    pub const PAID_IS_ON_CHAIN: &str = "a paid payout's transfer is in the canonical chain";
    /// Liveness.
    pub const EVERY_PAYOUT_PAID: &str = "every payout ends paid, by one transfer";
}

/// Blocks on top of a transaction's block, itself included, before it is
/// final, with the depth guard.
const DEPTH: usize = 2;

impl Chain {
    /// What `cargo test` checks: one payout under every fault once.
    pub fn ci() -> Chain {
        Chain {
            payouts: 1,
            faults: Faults {
                crashes: 1,
                drops: 1,
                reorgs: 1,
                replacements: 1,
                give_ups: 1,
            },
            guards: Guards::ALL,
        }
    }

    /// Two payouts sharing the sender's nonces, every fault once.
    pub fn two_payouts() -> Chain {
        Chain {
            payouts: 2,
            ..Chain::ci()
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> Chain {
        self.guards = guards;
        self
    }

    fn depth(&self) -> usize {
        if self.guards.depth {
            DEPTH
        } else {
            1
        }
    }

    /// The transaction of payout `p` that may still pay it.
    fn live_tx(s: &State, p: u8) -> Option<usize> {
        s.txs
            .iter()
            .position(|t| t.payout == p && !matches!(t.state, TxState::Abandoned | TxState::Filled))
    }

    /// Canonical transfers of payout `p`.
    fn transfers(s: &State, p: u8) -> usize {
        s.chain
            .iter()
            .flatten()
            .filter(|&&a| s.attempts[a as usize].pays == Pays::Payout(p))
            .count()
    }

    /// The sender's nonce on the chain: its transactions mined.
    fn chain_nonce(s: &State) -> usize {
        s.chain.iter().flatten().count()
    }

    /// Where a tracked attempt of tx `t` is in the canonical chain: its
    /// block and the attempt.
    fn mined_attempt(s: &State, t: usize) -> Option<(u8, u8)> {
        let tx = &s.txs[t];
        s.chain
            .iter()
            .enumerate()
            .find_map(|(b, a)| a.filter(|a| tx.tracked.contains(a)).map(|a| (b as u8, a)))
    }

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

    fn deliverer_actions(&self, s: &State, actions: &mut Vec<Action>) {
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

    fn node_actions(&self, s: &State, actions: &mut Vec<Action>) {
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

    fn all_paid(&self, s: &State) -> bool {
        (0..self.payouts).all(|p| s.payouts[p as usize] == PayoutState::Paid && Chain::transfers(s, p) == 1)
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

impl Described for Chain {
    fn name(&self) -> String {
        let g = self.guards;
        let mut without = Vec::new();
        for (on, name) in [
            (g.write_ahead, "write-ahead signing"),
            (g.every_attempt, "every attempt's hash"),
            (g.depth, "the confirmation depth"),
            (g.filler_confirmed, "the filler's confirmation"),
        ] {
            if !on {
                without.push(name);
            }
        }
        let without = if without.is_empty() {
            String::new()
        } else {
            format!("; without {}", without.join(", "))
        };
        let f = self.faults;
        format!(
            "chain rail ({} payout(s); {} crash, {} drop, {} reorg, {} replacement, {} give-up{without})",
            self.payouts, f.crashes, f.drops, f.reorgs, f.replacements, f.give_ups
        )
    }

    fn describe(&self, s: &State) -> String {
        let txs: Vec<String> = s
            .txs
            .iter()
            .enumerate()
            .map(|(i, t)| format!("tx{i} n{} p{} {:?} {:?}", t.nonce, t.payout, t.state, t.tracked).to_lowercase())
            .collect();
        let chain: Vec<String> = s
            .chain
            .iter()
            .map(|a| match a.map(|a| (a, s.attempts[a as usize].pays)) {
                Some((a, Pays::Payout(p))) => format!("a{a}:pay p{p}"),
                Some((a, Pays::Nothing)) => format!("a{a}:filler"),
                None => "-".to_string(),
            })
            .collect();
        format!(
            "payouts {:?} next nonce {} | txs [{}] | pool {:?} | chain [{}]",
            s.payouts,
            s.next_nonce,
            txs.join(", "),
            s.pool,
            chain.join(", ")
        )
        .to_lowercase()
    }
}
