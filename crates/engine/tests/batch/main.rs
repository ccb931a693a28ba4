//! The engine's batch queues, on a generic work table (`jobs.items`) with
//! a scripted handler, with real concurrency (many connections, many claim
//! loops, many daemons, several processes): no settlement anywhere. One
//! file per mechanism.

mod claims;
mod common;
mod failures;
mod leases;
mod partitions;
mod processes;
mod runs;
mod statement;
