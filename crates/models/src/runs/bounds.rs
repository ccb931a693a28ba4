//! The bounds the checks run the model at, and its variants without guards.

use super::{Faults, Guards, Runs};

impl Runs {
    /// The bounds `cargo test` checks.
    pub fn ci() -> Runs {
        Runs {
            daemons: 3,
            scopes: 2,
            faults: Faults {
                crashes: 1,
                item_failures: 1,
                cancels: 1,
                retries: 1,
            },
            guards: Guards::ALL,
        }
    }

    /// Deeper bounds (`--deep`).
    pub fn deep() -> Runs {
        Runs {
            daemons: 3,
            scopes: 3,
            faults: Faults {
                crashes: 1,
                item_failures: 2,
                cancels: 1,
                retries: 2,
            },
            guards: Guards::ALL,
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> Runs {
        self.guards = guards;
        self
    }
}
