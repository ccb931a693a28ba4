//! The chain model's actions: the deliverer's steps, the node's and the faults.

use std::fmt;

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
