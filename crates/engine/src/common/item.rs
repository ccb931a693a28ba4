//! What a claim hands the application: claimed items (key and fence), a
//! chunk of them, and what a handler did with one. The queue's statements
//! and both drains share these; none of them runs a loop.

use crate::common::fence::Fence;

/// One claimed item.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimedItem {
    /// The item's key, as text.
    pub key: String,
    /// The attempt number this claim represents: record it with the effect.
    pub fence: Fence,
}

/// The items one claim took, all of one run and scope.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The run the chunk belongs to.
    pub run_id: i64,
    /// The scope value (e.g. the period) as text.
    pub scope: String,
    /// The claimed items.
    pub items: Vec<ClaimedItem>,
}

impl Chunk {
    /// The items' keys, in claim order.
    pub fn keys(&self) -> Vec<String> {
        self.items.iter().map(|i| i.key.clone()).collect()
    }

    /// The items' fences, in claim order (bind them beside [`Chunk::keys`]).
    pub fn fences(&self) -> Vec<i32> {
        self.items.iter().map(|i| i.fence.get()).collect()
    }

    /// The same chunk with other items.
    pub fn with_items(&self, items: Vec<ClaimedItem>) -> Chunk {
        Chunk {
            run_id: self.run_id,
            scope: self.scope.clone(),
            items,
        }
    }

    pub(crate) fn new(run_id: i64, scope: &str, items: Vec<ClaimedItem>) -> Chunk {
        Chunk {
            run_id,
            scope: scope.to_string(),
            items,
        }
    }
}

/// What a handler did with a chunk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handled {
    /// Keys the application put on hold instead of working on them: they
    /// become `held` (final for this run) in the same transaction.
    pub held: Vec<String>,
}
