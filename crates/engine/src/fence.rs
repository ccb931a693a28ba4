//! The fence: an item's attempt number as of the claim that holds it.
//!
//! Every claim raises the item's `attempt`; a completion carries the fence its
//! claim returned and is refused unless the row still has it. The engine hands
//! the fence to the handler, which records it with the effect (the ledger's
//! `attempt`); nobody re-derives it.

/// An item's attempt number at the claim that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, sqlx::Type)]
#[sqlx(transparent)]
pub struct Fence(i32);

impl Fence {
    /// The stored attempt number.
    pub fn get(self) -> i32 {
        self.0
    }
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
