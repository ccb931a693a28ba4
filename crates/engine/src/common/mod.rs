//! The ground floor: what batch jobs and continuous queues both stand on.
//! Errors, fences and claimed items; the retry decision; leases and their
//! keeper; the loops of a drain or a serve, their backoff and the
//! process's outage clock; identifier and catalog checks; session settings,
//! item statuses and metric names. Nothing here names a batch or continuous
//! type: each queue plugs in its own statements (a [`lease::LeaseStore`],
//! its failure statements).

pub(crate) mod backoff;
pub(crate) mod error;
pub(crate) mod fence;
pub(crate) mod ident;
pub(crate) mod item;
pub(crate) mod lease;
pub(crate) mod loops;
pub(crate) mod outage;
pub(crate) mod retry;
pub(crate) mod session;
pub(crate) mod status;
pub(crate) mod telemetry;
