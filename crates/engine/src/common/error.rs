//! Errors the engine reports. Each names what went wrong and where.

/// An error from the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The database refused or failed a statement.
    #[error("database error while {context}: {source}")]
    Database {
        /// What the engine was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Applying the engine's migrations failed.
    #[error("applying the engine's migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A queue specification names an identifier that is not a plain SQL name.
    #[error("invalid {field} {value:?}: use lower-case letters, digits and '_' (optionally schema.name)")]
    InvalidIdentifier {
        /// Which field of the spec.
        field: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A scope that is not a value of the work table's scope type.
    #[error("scope {scope:?} is not a {scope_type} (a date is written YYYY-MM-DD)")]
    InvalidScope {
        /// The scope as given.
        scope: String,
        /// The queue's scope type.
        scope_type: String,
    },
    /// Another run of the same job is still running.
    #[error(
        "job {job:?} already has a running run (id {run_id}, scope {scope}); it must finish or be cancelled first"
    )]
    OtherRunActive {
        /// The job.
        job: String,
        /// The running run's id.
        run_id: i64,
        /// The running run's scope.
        scope: String,
    },
    /// The application refused to start a run of this scope (its hook said why).
    #[error("cannot start the run of {job:?} for {scope}: {reason}")]
    StartRefused {
        /// The job.
        job: String,
        /// The scope.
        scope: String,
        /// Why, in the application's words.
        reason: String,
    },
    /// The work table lacks what the engine's statements need.
    #[error("work table {table} cannot serve as a queue; it lacks: {}", missing.join("; "))]
    WorkTable {
        /// The table.
        table: String,
        /// Each missing column or index, named.
        missing: Vec<String>,
    },
    /// The database stayed away longer than allowed.
    #[error("the database was unavailable for {secs} s, longer than allowed; last error: {last}")]
    Unavailable {
        /// How long it was away.
        secs: u64,
        /// The last error seen.
        last: String,
    },
    /// A configuration value outside its allowed range.
    #[error("{0}")]
    Config(String),
    /// A run id that does not exist.
    #[error("run {0} does not exist")]
    NoSuchRun(i64),
    /// COMMIT was sent and failed without an answer that says the
    /// transaction did not commit (the connection was lost, the server shut
    /// down at it): it may or may not have committed.
    #[error("the outcome of COMMIT while {context} is unknown (it may have committed): {source}")]
    CommitOutcomeUnknown {
        /// What the transaction was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// An invariant the engine relies on did not hold; the transaction was rolled back.
    #[error("invariant violated: {0}")]
    Invariant(String),
    /// The application's handler failed on a chunk; the chunk was rolled back.
    #[error("handler failed on a chunk of {items} items (first key {first_key}): {source}")]
    Handler {
        /// Items in the chunk.
        items: usize,
        /// The chunk's first key.
        first_key: String,
        /// The handler's error.
        #[source]
        source: HandlerError,
    },
    /// The database refused a statement for a reason no retry can change
    /// and no item causes (see [`is_deployment_fault`]): a grant or a
    /// migration is missing. The drain stops; no item is failed for it.
    #[error(
        "the database refused role {role}: {message} (SQLSTATE {code}, while {context}); a grant or a migration is missing, not an item's fault: this worker stops and fails no item"
    )]
    Refused {
        /// The role the statement ran as (and the login, when another).
        role: String,
        /// What the engine was doing.
        context: String,
        /// The SQLSTATE.
        code: String,
        /// The database's message (it names the table, column or function).
        message: String,
    },
    /// The handler failed too many times in a row.
    #[error("giving up after {attempts} consecutive failures; last: {last}")]
    TooManyFailures {
        /// How many failures in a row.
        attempts: u32,
        /// The last failure.
        last: String,
    },
}

impl EngineError {
    /// Wraps a driver error with what the engine was doing.
    pub fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> EngineError {
        move |source| EngineError::Database { context, source }
    }

    /// The database error inside, and what the engine was doing.
    fn database_error(&self) -> Option<(String, &sqlx::Error)> {
        match self {
            EngineError::Database { context, source } => Some((context.to_string(), source)),
            EngineError::Handler {
                source: HandlerError::Database(source),
                items,
                ..
            } => Some((format!("settling a chunk of {items} items"), source)),
            _ => None,
        }
    }

    /// A fatal error (see [`EngineError::is_fatal`]) said as
    /// [`EngineError::Refused`], naming the role it ran as on `pool`.
    pub async fn refused(self, pool: &sqlx::PgPool) -> EngineError {
        let Some((context, db)) = self.database_error().filter(|_| self.is_fatal()) else {
            return self;
        };
        let (code, message) = db
            .as_database_error()
            .map(|e| (e.code().unwrap_or_default().into_owned(), e.message().to_string()))
            .unwrap_or_default();
        let role = sqlx::query_as::<_, (String, String)>("SELECT current_user::text, session_user::text")
            .fetch_one(pool)
            .await
            .map_or_else(
                |_| "(unknown)".to_string(),
                |(role, login)| {
                    if role == login {
                        role
                    } else {
                        format!("{role} (login {login})")
                    }
                },
            );
        EngineError::Refused {
            role,
            context,
            code,
            message,
        }
    }

    /// Wraps the error of a COMMIT: once COMMIT is sent, no error proves it
    /// did not commit (`tx.commit().await.map_err(EngineError::at_commit("..."))`).
    pub fn at_commit(context: &'static str) -> impl FnOnce(sqlx::Error) -> EngineError {
        move |source| EngineError::CommitOutcomeUnknown { context, source }
    }
}

/// An error from an application's handler.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// A database statement of the handler failed (the chunk is rolled back).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Worth retrying later: a timeout, an unavailable provider.
    #[error("{0}")]
    Transient(String),
    /// Retrying cannot help: bad data, a refusal.
    #[error("{0}")]
    Permanent(String),
    /// Not now, and not the job's fault (a provider down or rate limiting):
    /// try again after `after` without spending an attempt (a continuous
    /// queue's job); elsewhere the same as [`HandlerError::Transient`].
    #[error("snoozed for {after:?}: {reason}")]
    Snooze {
        /// How long to wait.
        after: std::time::Duration,
        /// Why.
        reason: String,
    },
}

impl HandlerError {
    /// True when no item can succeed until the deployment changes (see
    /// [`is_deployment_fault`]): the drain stops instead of failing items.
    /// Check it before [`HandlerError::is_permanent`].
    pub fn is_fatal(&self) -> bool {
        matches!(self, HandlerError::Database(err) if is_deployment_fault(err))
    }

    /// True when retrying the same item cannot succeed.
    pub fn is_permanent(&self) -> bool {
        match self {
            HandlerError::Database(err) => !is_transient_sqlx(err),
            HandlerError::Transient(_) | HandlerError::Snooze { .. } => false,
            HandlerError::Permanent(_) => true,
        }
    }
}

/// Lost connections, timeouts, serialization failures and deadlocks pass;
/// data and constraint errors (SQLSTATE classes 22, 23, ...) do not.
pub fn is_transient_sqlx(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // 40: transaction rollback (serialization, deadlock); 53: resources;
            // 57: operator intervention (shutdown, terminated backend, still
            // starting or in recovery: 57P03); 08: connection; 25006: a
            // read-only transaction, as on a primary just demoted.
            code == "25006" || ["40", "53", "57", "08"].iter().any(|class| code.starts_with(class))
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// True when the statement cannot run as deployed, whatever the item and
/// however often it is retried: SQLSTATE class 42 (a privilege missing,
/// 42501; a table, column or function that does not exist; a statement the
/// server cannot parse) or 3F000 (no such schema). A grant or a migration
/// is missing; no item's data can cause it.
pub fn is_deployment_fault(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code.starts_with("42") || code == "3F000")
}

impl EngineError {
    /// True when the process cannot do its work until the deployment changes
    /// (see [`is_deployment_fault`]): a claim loop stops at once, without
    /// retrying and without failing items.
    pub fn is_fatal(&self) -> bool {
        match self {
            EngineError::Refused { .. } => true,
            EngineError::Database { source, .. } => is_deployment_fault(source),
            EngineError::Handler { source, .. } => source.is_fatal(),
            _ => false,
        }
    }

    /// True for failures that pass by themselves (the database restarting,
    /// a terminated connection): retried without limit, with backoff.
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Database { source, .. } => is_transient_sqlx(source),
            EngineError::Handler { source, .. } => !source.is_permanent(),
            _ => false,
        }
    }
}

/// True when `err` is a unique violation (SQLSTATE 23505) of `constraint`.
pub fn is_unique_violation(err: &sqlx::Error, constraint: &str) -> bool {
    err.as_database_error()
        .is_some_and(|e| e.code().as_deref() == Some("23505") && e.constraint() == Some(constraint))
}
