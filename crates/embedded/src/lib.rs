//! settled-embedded: the private PostgreSQL that `settled` starts from the
//! installed server binaries when `DATABASE_URL` is unset (the "embedded
//! default"), and that the lab and the tests start too.
//!
//! Owns: finding `initdb`/`pg_ctl`, creating a data directory the server's OS
//! user can reach, starting the server on its own Unix socket and port, and
//! stopping it (also when the process that started it dies). Never: anything
//! about work queues or money, or test helpers (those are `settled-testkit`).

mod local;

pub use local::{find_binaries, LocalOptions, LocalPostgres, PgBinaries};

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

/// Replaces the database name in a `postgres://` URL, keeping its query.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}
