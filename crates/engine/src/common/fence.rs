//! The fence: which claim of an item a worker holds.
//!
//! Every claim raises the item's `attempt`; a completion carries the fence its
//! claim returned and is refused unless the row still has it. The engine hands
//! the fence to the handler, which records its attempt with the effect (the
//! ledger's `attempt`); nobody re-derives it.
//!
//! A leased claim also stamps the row with the timeline of the primary that
//! granted it (`fence_epoch`, from the WAL position: promoting a standby
//! starts a new timeline), and the fence is the pair. With asynchronous
//! replication a failover can lose a committed claim, and the new primary
//! then hands out the same attempt number again; the timeline differs, so a
//! worker still holding the lost claim (a zombie from before the failover)
//! cannot complete in the new claim's name. See docs/reliability.md.

/// An item's claim: the primary's timeline at the claim (0 for claims held
/// by a transaction, which a failover cannot outlive) and the attempt number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, sqlx::Type)]
#[sqlx(transparent)]
pub struct Fence(i64);

impl Fence {
    /// The attempt number (what the effect records).
    pub fn get(self) -> i32 {
        (self.0 & 0xFFFF_FFFF) as i32
    }

    /// The timeline of the primary that granted the claim (0: a claim held
    /// by its transaction).
    pub fn epoch(self) -> i32 {
        (self.0 >> 32) as i32
    }

    /// Both, as the fenced statements bind them: `(epoch << 32) | attempt`.
    pub fn packed(self) -> i64 {
        self.0
    }
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.epoch() {
            0 => self.get().fmt(f),
            epoch => write!(f, "{}@{epoch}", self.get()),
        }
    }
}

/// A row's fence in SQL (the work table aliased `t`), to compare with a
/// packed [`Fence`].
pub(crate) const ROW_FENCE: &str = "((t.fence_epoch::bigint << 32) | t.attempt::bigint)";
