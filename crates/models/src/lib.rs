//! settled-models: settled's protocols as models a checker explores
//! exhaustively (stateright), within stated bounds.
//!
//! - [`leased`]: claims, leases, renewal, rescue, the fenced completion, the
//!   provider's idempotency key, crashes, pauses, failovers, in-transaction
//!   claims.
//! - [`runs`]: start-or-join, one finisher, retry and reopen, cancel and
//!   resume, several daemons on the same due times, catch-up.
//! - [`payouts`]: payout requests under their keys, the payout state
//!   machine, confirmation, cancel and expiry, delivery on its leased
//!   queue, the provider's webhooks and lookups.
//! - [`chain`]: the chain rail: write-ahead signing, broadcasts a node
//!   forgets, replacements, reorgs, a nonce given up and filled.
//!
//! Each action names the function and the statement it models; each state
//! variable names the column it stands for. Each model has a field per guard
//! ([`leased::Guards`], ...) so a variant without one is the same model,
//! and the tests show each such variant fails. [`check`] runs them and
//! prints counterexamples one action a line. This crate owns the models and
//! never touches a database; `tests/` replays their counterexamples against
//! the real one.

pub mod chain;
pub mod check;
pub mod leased;
pub mod payouts;
pub mod runs;
pub mod signal;
pub mod suite;
