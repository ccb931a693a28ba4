//! Continuous queues, with real connections and processes: enqueue inside
//! the caller's transaction, serving in both modes, failures and dead
//! letters, retention, several processes killed and paused past their
//! leases, a restart of PostgreSQL. One file per mechanism.

mod common;
mod enqueue;
mod example;
mod failure;
mod order;
mod processes;
mod retention;
mod serve;
