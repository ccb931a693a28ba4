//! settled: settle creators' rewards from token trade volume exactly once,
//! with any number of worker processes on any number of servers.
//!
//! The money path reads top to bottom in three files:
//! `settled_engine::queue` (claim with SKIP LOCKED), [`settlement`] (pay a
//! chunk), `settled_engine::executor` (mark settled, commit).

pub mod address;
pub mod api;
pub mod bench;
pub mod chaos;
pub mod cli;
pub mod config;
pub mod db;
pub mod demo;
pub mod import;
pub mod money;
pub mod period;
pub mod progress;
pub mod provider;
pub mod provider_sim;
pub mod runs_cmd;
pub mod seed;
pub mod settlement;
pub mod status;
pub mod verify;
pub mod worker;
