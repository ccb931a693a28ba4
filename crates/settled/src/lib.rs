//! settled: settle creators' rewards from token trade volume exactly once,
//! with any number of worker processes on any number of servers.
//!
//! The money path reads top to bottom in three files: the engine's chunk
//! statement (`crates/engine/src/batch/queue/statement.rs`: claim with SKIP
//! LOCKED, mark settled, hand out fences), [`settlement`] (pay a chunk with
//! those fences), the engine's drain (`crates/engine/src/batch/drain/`: check the
//! counts, commit). Money leaves through [`payouts`].
//!
//! This crate is only the product: settlement, its commands ([`cmd`]), the
//! HTTP API and dashboard ([`api`]). The lab (benchmarks, chaos, the
//! provider simulator) is the `settled-lab` crate; the binary that offers
//! both is `settled-cli`.

pub mod address;
pub mod api;
pub mod archive;
pub(crate) mod audit;
pub(crate) mod balance;
pub mod chain;
pub mod cmd;
pub(crate) mod config;
pub mod db;
pub(crate) mod demo;
pub(crate) mod failover;
pub mod import;
pub(crate) mod json;
pub mod money;
pub mod partitions;
pub mod payouts;
pub mod period;
pub mod progress;
pub mod provider;
pub(crate) mod queues;
pub(crate) mod run_state;
pub mod seed;
pub mod settlement;
pub(crate) mod status;
pub(crate) mod telemetry;
pub mod tokens;
pub mod verify;
pub(crate) mod watch;
pub mod worker;
pub(crate) mod worker_metrics;
