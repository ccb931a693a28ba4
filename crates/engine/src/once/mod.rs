//! Once-only primitives for request handling, each timed by the database
//! clock: one-time tokens ([`token`]), idempotency keys ([`idempotency`]) and
//! named leases with fencing tokens ([`named_lease`]). None of them holds a
//! lock across requests; conditional updates and primary keys decide.

pub mod idempotency;
pub mod named_lease;
pub mod token;
