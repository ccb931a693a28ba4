//! Batch jobs: a work table with a scope column, drained once per scope by
//! a run. The [`job::Job`] owns a run's lifecycle (start, finish, cancel,
//! reopen) over `runs.rs`; the [`drainer::Drainer`] drains a run in either
//! mode, in transactions (`drain/`) or leased (`leased.rs`), over a work
//! table's statements (`queue/`) and the run's key ranges (`ranges.rs`),
//! counting in its [`stats::DrainStats`]; the rescuer returns expired leases; `workers.rs` is the worker registry;
//! the daemon (`daemon.rs`, on its [`schedule::Schedule`]) starts runs at
//! their due times. It stands on `common/` and never uses `continuous/`.

pub(crate) mod daemon;
pub(crate) mod drain;
pub(crate) mod drainer;
pub(crate) mod job;
pub(crate) mod leased;
pub(crate) mod queue;
pub(crate) mod ranges;
pub(crate) mod rescuer;
pub(crate) mod runs;
pub(crate) mod schedule;
pub(crate) mod stats;
pub(crate) mod workers;
