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

mod action;
mod described;
mod enabled;
mod model;
mod state;

pub use action::Action;
pub use state::{Attempt, PayoutState, Pays, State, TxRow, TxState};

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
}
