//! settled-testkit: per-test databases on a shared throwaway PostgreSQL
//! (`TestDb`), a real PgBouncer in front of one (`PgBouncer`),
//! a proxy that loses a COMMIT or its answer (`PgProxy`, with a `FaultPlan`),
//! a real EVM node (`Anvil`, Foundry's anvil from the npm registry) and
//! what its users share on it (`chain`: accounts, bytecode, JSON-RPC),
//! for the test suites only. The server itself is `settled-embedded`,
//! re-exported here for tests' convenience.

mod anvil;
pub mod chain;
mod pgbouncer;
mod pgproxy;
mod process;
mod testdb;

pub use anvil::{anvil_program, find_anvil, Anvil, ANVIL_VAR};
pub use pgbouncer::{find_pgbouncer, PgBouncer};
pub use pgproxy::{CommitFault, FaultPlan, PgProxy};
pub use process::terminate;
pub use settled_embedded::{find_binaries, with_database, Error, LocalOptions, LocalPostgres, PgBinaries, Result};
pub use testdb::{shared_test_server, wait_for_true, TestDb};
