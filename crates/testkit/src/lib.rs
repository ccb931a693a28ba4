//! settled-testkit: per-test databases on a shared throwaway PostgreSQL
//! (`TestDb`), a real PgBouncer in front of one (`PgBouncer`), and a proxy
//! that loses the answer to a COMMIT (`LostCommitProxy`), for the test
//! suites only. The server itself is `settled-embedded`, re-exported here
//! for tests' convenience.

mod lost_commit;
mod pgbouncer;
mod testdb;

pub use lost_commit::LostCommitProxy;
pub use pgbouncer::{find_pgbouncer, PgBouncer};
pub use settled_embedded::{find_binaries, with_database, Error, LocalOptions, LocalPostgres, PgBinaries, Result};
pub use testdb::{shared_test_server, TestDb};
