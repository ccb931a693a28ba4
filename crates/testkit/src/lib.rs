//! A private PostgreSQL started from the installed server binaries, and
//! per-test databases on it.
//!
//! Owns: finding `initdb`/`pg_ctl`, creating a data directory the server's OS
//! user can reach, starting the server on its own Unix socket and port,
//! stopping it (also when the process that started it dies), and handing out
//! one fresh database per test. Never: anything about work queues or money.

mod local;
mod testdb;

pub use local::{find_binaries, LocalOptions, LocalPostgres, PgBinaries};
pub use testdb::{shared_test_server, with_database, TestDb};

/// Errors from finding, creating, starting or stopping a private server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No PostgreSQL server binaries were found and no `DATABASE_URL` was given.
    #[error(
        "no PostgreSQL server binaries found (looked in $PG_BIN, $PATH and /usr/lib/postgresql/*/bin): \
         install them (Debian/Ubuntu: `apt-get install postgresql`) or set DATABASE_URL to an existing server"
    )]
    NoBinaries,
    /// A file-system step failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A server program (initdb, pg_ctl) failed; carries its output.
    #[error("{program} failed: {output}")]
    Program {
        /// The program that failed.
        program: String,
        /// Its standard error and output, trimmed.
        output: String,
    },
    /// A database-level step failed.
    #[error("{0}")]
    Database(#[from] sqlx::Error),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
