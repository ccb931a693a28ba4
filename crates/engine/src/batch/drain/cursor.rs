//! Where a claim loop claims next: its run's key ranges (see
//! [`crate::batch::ranges`]), and the cursor inside the range it took.

use sqlx::PgConnection;

use super::{idle_or_drained, Step, Target};
use crate::batch::queue::KeyWindow;
use crate::batch::ranges::{KeyRange, RunRanges};
use crate::common::error::EngineError;

/// Where a claim loop is in its run's key ranges (see [`crate::batch::ranges`]).
#[derive(Debug)]
pub(super) struct ClaimCursor {
    ranges: RunRanges,
    at: std::sync::Mutex<At>,
}

#[derive(Debug, Clone)]
enum At {
    /// Between ranges: take the next free one.
    NoRange,
    /// In a range; its `after` is where the next claim goes on.
    Range(KeyRange),
    /// Every range of the run was taken: claim from the start of the scope.
    NoneLeft,
}

/// The keys of a loop's next claim: within its range after its cursor, or,
/// with no range left, the whole scope.
#[derive(Debug, Clone)]
pub(super) struct Window {
    ranged: bool,
    pub(super) after: Option<String>,
    upto: Option<String>,
}

impl Window {
    pub(super) fn keys(&self) -> KeyWindow<'_> {
        KeyWindow {
            after: self.after.as_deref(),
            upto: self.upto.as_deref(),
        }
    }
}

impl ClaimCursor {
    pub(super) fn new(ranges: RunRanges) -> ClaimCursor {
        ClaimCursor {
            ranges,
            at: std::sync::Mutex::new(At::NoRange),
        }
    }

    /// The window of the next claim: the loop's range from its cursor, a
    /// range newly taken on `conn` (committed at once: call it outside a
    /// transaction), or the whole scope when no range is left.
    pub(super) async fn window(&self, conn: &mut PgConnection) -> Result<Window, EngineError> {
        let at = self.at.lock().expect("cursor lock").clone();
        let at = match at {
            At::NoRange => {
                let taken = self.ranges.take(conn).await?.map_or(At::NoneLeft, At::Range);
                *self.at.lock().expect("cursor lock") = taken.clone();
                taken
            }
            at => at,
        };
        Ok(match at {
            At::Range(range) => Window {
                ranged: true,
                after: range.after,
                upto: range.upto,
            },
            At::NoRange | At::NoneLeft => Window {
                ranged: false,
                after: None,
                upto: None,
            },
        })
    }

    /// After a claim of `claimed` items ending at `last` in `window`: a
    /// claim that ran short ends the loop's range; otherwise the loop goes
    /// on after `last`.
    pub(super) fn advance(&self, window: &Window, claimed: usize, limit: u32, last: Option<String>) {
        if !window.ranged {
            return;
        }
        let mut at = self.at.lock().expect("cursor lock");
        match &mut *at {
            At::Range(range) if claimed >= limit as usize => range.after = last,
            _ => *at = At::NoRange,
        }
    }
}

impl Window {
    /// After an empty claim in this window: the next range, or (with none
    /// left) done, or others hold the rest (or it waits for a retry time).
    pub(super) async fn after_empty_claim(&self, conn: &mut PgConnection, t: &Target) -> Result<Step, EngineError> {
        if self.ranged {
            return Ok(Step::NextRange);
        }
        idle_or_drained(conn, &t.queue, t.run_id, &t.scope).await
    }
}
