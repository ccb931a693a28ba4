//! Reconciliation: settled's payouts against the provider's payments. One
//! comparison ([`compare`]) serves `settled reconcile`, `settled verify
//! --payouts --provider-url` and `settled verify --period --provider-url`.
//! It reads and reports; it never moves a payout (delivery, webhooks and
//! lookups do, through the state machine).
//!
//! A payment belongs to the payout whose provider key it was made under.
//! What settled says of a payout against what the provider says of its
//! payment ([`judge`](compare::judge)):
//!
//! | settled | provider | verdict |
//! |---|---|---|
//! | queued | any | in flight: delivery records the answer |
//! | sent | pending | agree |
//! | sent | paid, failed, returned | behind: a webhook or a lookup applies it |
//! | paid | paid | agree |
//! | paid | returned, failed (a return) | behind: a webhook or a lookup returns it |
//! | failed | failed, returned, or no payment (refused) | agree (nothing left for good) |
//! | returned | returned, failed | agree |
//! | sent, paid | no payment | missing at the provider |
//! | paid | pending | states disagree |
//! | failed, returned | pending, paid | states disagree (the funds were returned) |
//! | created, cancelled, expired | any payment | states disagree (never sent) |
//!
//! Apart from the provider: a queued withdrawal whose delivery job is a dead
//! letter (or missing) is stranded: its funds are held and nothing will
//! send it until `settled queues replay payout_delivery` does. A payout (or
//! a settlement item not yet recorded as one) whose key waits for an
//! operator is named apart: past the provider's key window the provider
//! could not say whether it holds its payment, and nothing is sent under it
//! until an operator checks (`key_window.rs`).
//!
//! A payout is paid twice when more than one payment that has not failed
//! or come back claims it: those under its key (a provider that forgot the
//! key and took a second request under it as new), and any whose reference
//! is its key or its id (delivery sends a payout's provider key as its
//! reference, or its id for payouts keyed by id).
//! Payments whose reference names no payout are paid twice when two that
//! have not failed share creator and reference.

mod compare;
mod load;
mod report;
#[cfg(test)]
mod tests;

pub(crate) use compare::compare;
#[cfg(test)]
use compare::judge;
pub(crate) use load::{reconcile, Scope};
pub(crate) use report::{Comparison, Lag, Mismatch, MismatchKind, PayoutRecord, Verdict};
