//! The states of a work item, as stored in the work table's `status` column.

use std::fmt;

/// Where an item stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemStatus {
    /// Waiting to be claimed (once `not_before` has passed, if set).
    Eligible,
    /// Claimed by a lease that has not completed yet.
    Processing,
    /// Done, exactly once.
    Settled,
    /// Gave up after its attempts; `last_error` says why.
    Failed,
    /// Not worked on because the application put it on hold.
    Held,
}

impl ItemStatus {
    /// All states, in display order.
    pub const ALL: [ItemStatus; 5] = [
        ItemStatus::Eligible,
        ItemStatus::Processing,
        ItemStatus::Settled,
        ItemStatus::Failed,
        ItemStatus::Held,
    ];

    /// The value stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::Eligible => "eligible",
            ItemStatus::Processing => "processing",
            ItemStatus::Settled => "settled",
            ItemStatus::Failed => "failed",
            ItemStatus::Held => "held",
        }
    }

    /// Parses a stored value.
    pub fn parse(value: &str) -> Option<ItemStatus> {
        ItemStatus::ALL.into_iter().find(|s| s.as_str() == value)
    }

    /// True when no more work will happen on the item in this run.
    pub fn is_final(self) -> bool {
        matches!(self, ItemStatus::Settled | ItemStatus::Failed | ItemStatus::Held)
    }
}

impl fmt::Display for ItemStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
