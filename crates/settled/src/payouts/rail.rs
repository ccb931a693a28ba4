//! The seam between delivery and whatever pays: one trait, [`Rail`].
//! Delivery and the lookup of long-sent payouts call a rail only through
//! it; the provider protocol's HTTP client implements it
//! (`provider/http.rs`). A rail pays a payout at most once however often
//! it is called (the payout's provider key names the payment on every
//! call, after any crash), and answers with its own record of the payment,
//! which [`super::word::read`] reads. A rail that cannot tell yet (a
//! transfer not confirmed, say) answers `pending`: the payout is `sent`,
//! and is looked up later. What a rail keeps of its own for a payout it
//! stores itself, keyed by the payout. A rail never moves a payout.

use std::future::Future;

use super::PayoutRow;
use crate::provider::{Payment, ProviderError};

/// A way of paying payouts.
pub trait Rail: Send + Sync + 'static {
    /// Whether each payout sent is a call the fleet's provider rate limit
    /// (`--provider-rate`) counts. The chain rail calls its node once per
    /// transaction, not per payout, and is not limited by it.
    const RATE_LIMITED: bool = true;

    /// Whether the rail forgets a payment's key after a while (the
    /// provider's key window, `super::key_window`), so that a late retry
    /// must look the payment up by its reference first. The chain rail's
    /// record is settled's own database: it never forgets.
    const KEYS_EXPIRE: bool = true;

    /// Sends `payout`'s payment, or asks again for the one sent before
    /// (never a second payment), passing on `traceparent` (the W3C trace
    /// context of the work it is sent for) where the rail can: the rail's
    /// record of the payment, or why there is no answer to act on.
    fn send(
        &self,
        payout: &PayoutRow,
        traceparent: Option<&str>,
    ) -> impl Future<Output = Result<Payment, ProviderError>> + Send;

    /// The rail's record of `payout`'s payment now, or None when the rail
    /// has none.
    fn look_up(&self, payout: &PayoutRow) -> impl Future<Output = Result<Option<Payment>, ProviderError>> + Send;

    /// Every payment the rail made for `payout`, found without its key (by
    /// the payout's reference): what settled asks once the rail may have
    /// forgotten the key (`payouts::key_window`). Empty: the rail certainly
    /// made none; `Err(Refused)`: it cannot say.
    fn find(&self, payout: &PayoutRow) -> impl Future<Output = Result<Vec<Payment>, ProviderError>> + Send;
}
