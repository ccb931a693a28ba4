//! The bounds the checks run the model at, and its variants without guards.

use super::{Faults, Guards, Payouts};

impl Payouts {
    /// Bounds `cargo test` checks: one payout with a confirmation token
    /// (two redemptions racing, a cancel, the expiry), every delivery fault,
    /// one attempt before a dead letter.
    pub fn ci_confirmed() -> Payouts {
        Payouts {
            requests: 1,
            credit: 1,
            confirm: true,
            workers: 2,
            max_attempts: 1,
            faults: Faults {
                crashes: 1,
                pauses: 1,
                provider_unavailable: 1,
                applied_then_timed_out: 1,
                refusals: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                redemptions: 2,
                cancels: 1,
                request_repeats: 0,
                key_lock_expiries: 0,
                returns: 0,
            },
            guards: Guards::ALL,
        }
    }

    /// Bounds `cargo test` checks: two payouts on a balance for one.
    pub fn ci_two_payouts() -> Payouts {
        Payouts {
            requests: 2,
            credit: 1,
            confirm: false,
            workers: 2,
            max_attempts: 2,
            faults: Faults {
                crashes: 1,
                applied_then_timed_out: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                ..Faults::default()
            },
            guards: Guards::ALL,
        }
    }

    /// Bounds `cargo test` checks: one request sent twice with its key, the
    /// first one's key lock passing, on a balance for two.
    pub fn ci_repeated_request() -> Payouts {
        Payouts {
            requests: 1,
            credit: 2,
            confirm: false,
            workers: 2,
            max_attempts: 1,
            faults: Faults {
                crashes: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                request_repeats: 1,
                key_lock_expiries: 1,
                ..Faults::default()
            },
            guards: Guards::ALL,
        }
    }

    /// Bounds `cargo test` checks: one payout, its payment paid and then
    /// returned by the bank (or failed), the webhooks (its paid, its
    /// returned) duplicated and lost, in any order, so the return is heard
    /// before its paid, twice, or only by a look-up.
    pub fn ci_returned() -> Payouts {
        Payouts {
            requests: 1,
            credit: 1,
            confirm: false,
            workers: 1,
            max_attempts: 1,
            faults: Faults {
                applied_then_timed_out: 1,
                provider_failures: 1,
                webhook_duplicates: 1,
                webhook_losses: 1,
                returns: 1,
                ..Faults::default()
            },
            guards: Guards::ALL,
        }
    }

    /// Deeper bounds: two payouts, both returned, every delivery fault.
    pub fn deep_returned() -> Payouts {
        Payouts {
            requests: 2,
            credit: 2,
            workers: 2,
            faults: Faults {
                crashes: 1,
                provider_failures: 1,
                webhook_duplicates: 2,
                returns: 2,
                ..Payouts::ci_returned().faults
            },
            ..Payouts::ci_returned()
        }
    }

    /// Deeper bounds (`--deep`): two confirmed payouts on a balance for both.
    pub fn deep_confirmed() -> Payouts {
        Payouts {
            requests: 2,
            credit: 2,
            ..Payouts::ci_confirmed()
        }
    }

    /// Deeper bounds: two payouts on a balance for one, every delivery fault
    /// (those of [`Payouts::ci_confirmed`], without its confirmation).
    pub fn deep_two_payouts() -> Payouts {
        let ci = Payouts::ci_confirmed();
        Payouts {
            requests: 2,
            confirm: false,
            faults: Faults {
                redemptions: 0,
                cancels: 0,
                ..ci.faults
            },
            ..ci
        }
    }

    /// Deeper bounds: two requests, each sent again, a key lock passing,
    /// on a balance for three.
    pub fn deep_repeated_requests() -> Payouts {
        let ci = Payouts::ci_repeated_request();
        Payouts {
            requests: 2,
            credit: 3,
            faults: Faults {
                request_repeats: 2,
                ..ci.faults
            },
            ..ci
        }
    }

    /// This model without some guards.
    pub fn without(mut self, guards: Guards) -> Payouts {
        self.guards = guards;
        self
    }
}
