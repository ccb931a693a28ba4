//! The bounds the checks run the model at, and its variants without guards.

use super::{Faults, Guards, LeasedWork, Replication};

impl LeasedWork {
    /// The bounds `cargo test` checks (leased workers, asynchronous failover).
    pub fn ci() -> LeasedWork {
        LeasedWork {
            items: 1,
            leased_workers: 2,
            tx_workers: 0,
            max_attempts: 2,
            replication: Replication::Asynchronous,
            faults: Faults {
                crashes: 1,
                pauses: 1,
                slow_renewals: 1,
                provider_unavailable: 1,
                applied_then_timed_out: 1,
                failovers: 1,
            },
            guards: Guards::ALL,
        }
    }

    /// The same, with a synchronous standby.
    pub fn ci_synchronous() -> LeasedWork {
        LeasedWork {
            replication: Replication::Synchronous,
            ..LeasedWork::ci()
        }
    }

    /// In-transaction workers beside a leased one (SKIP LOCKED between the
    /// modes; a crash in the middle of a transaction; failover): the CI
    /// bounds with one leased and two in-transaction workers, and the
    /// provider always up.
    pub fn ci_in_transaction() -> LeasedWork {
        let ci = LeasedWork::ci();
        LeasedWork {
            leased_workers: 1,
            tx_workers: 2,
            faults: Faults {
                provider_unavailable: 0,
                ..ci.faults
            },
            ..ci
        }
    }

    /// Deeper bounds (`--deep`): three leased workers.
    pub fn deep() -> LeasedWork {
        LeasedWork {
            leased_workers: 3,
            ..LeasedWork::ci()
        }
    }

    /// Deeper bounds: two failovers.
    pub fn deep_two_failovers() -> LeasedWork {
        let mut model = LeasedWork::ci();
        model.faults.failovers = 2;
        model
    }

    /// Deeper bounds: two items (no pauses nor slow renewals).
    pub fn deep_two_items() -> LeasedWork {
        let mut model = LeasedWork::ci();
        model.items = 2;
        model.faults.pauses = 0;
        model.faults.slow_renewals = 0;
        model
    }

    /// Deeper bounds: two leased workers and one in-transaction worker.
    pub fn deep_in_transaction() -> LeasedWork {
        LeasedWork {
            tx_workers: 1,
            ..LeasedWork::ci()
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> LeasedWork {
        self.guards = guards;
        self
    }
}
