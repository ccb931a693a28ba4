//! The scheduling daemon: every server runs the same loop, and the database
//! decides who starts what.
//!
//! At each due time of the job's [`Schedule`](crate::Schedule) the scope that due time covers
//! ([`RunHooks::scope_for_due`](crate::RunHooks::scope_for_due)) gets its run: exactly one daemon's insert
//! creates it, the others join. Runs missed while no daemon was up are
//! created oldest first (catch-up), one running run per job at a time. A
//! finished run whose items became eligible again is reopened. Idle daemons
//! sleep until the next due time, a notification (LISTEN), or the next poll,
//! whichever comes first: a lost notification costs one poll, never a run.
//!
//! Its loop lives with the batch jobs (`batch/daemon.rs`); this module is
//! its public face.

pub use crate::batch::daemon::{due_scopes, run, DaemonConfig, MAX_OUTAGE_BACKOFF, MIN_POLL_MS};
