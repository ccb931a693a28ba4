//! The chain model's state: payouts, `chain_txs` rows with their attempts,
//! the node's pool and its canonical chain.

use std::collections::BTreeSet;

use super::Faults;

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
