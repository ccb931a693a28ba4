//! The audit log of the server's requests, driven by the table of routes:
//! [`super::auth::authorize`] hands every request of a route that acts (a
//! POST behind a role) to [`around`], and counts every refusal (401, 403)
//! with [`refusal`]. A request that acts writes its row inside the
//! transaction of its effect: [`super::commit`], the one commit of the
//! API's and the dashboard's writes, appends the row of the request in
//! progress (held in a task-local while its handler runs) before COMMIT.
//! A request that committed nothing (refused, invalid, answered from an
//! idempotency key) gets its row afterwards, on its own. Handlers may name
//! what they acted on ([`set_target`]) or how it ended ([`set_outcome`]).
//! Never: a row for a read that was allowed, or a row the roles could change.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use axum::response::Response;

use super::AppState;
use crate::audit::Entry;

/// The actor of a request that carried no token.
pub const ANONYMOUS: &str = "anonymous";
/// The actor of a request whose token is unknown or revoked.
pub const UNKNOWN_TOKEN: &str = "unknown-token";

/// The request in progress: its row, and whether a commit wrote it.
#[derive(Debug)]
struct InFlight {
    entry: Mutex<Entry>,
    recorded: AtomicBool,
}

tokio::task_local! {
    static REQUEST: Arc<InFlight>;
}

fn with_entry(change: impl FnOnce(&mut Entry)) {
    let _ = REQUEST.try_with(|flight| change(&mut flight.entry.lock().unwrap_or_else(|e| e.into_inner())));
}

/// Names what the request in progress acted on (a payout made, a hold placed).
pub fn set_target(target: impl Into<String>) {
    let target = target.into();
    with_entry(|e| e.target = target);
}

/// Says how the request in progress ended, when its commit is not plainly
/// [`crate::audit::OK`] (a refusal stored under an idempotency key).
pub fn set_outcome(outcome: impl Into<String>) {
    let outcome = outcome.into();
    with_entry(|e| e.outcome = outcome);
}

/// Runs `handler` for the request `entry` describes; writes its row
/// afterwards unless its commit did.
pub async fn around(state: &AppState, entry: Entry, handler: impl std::future::Future<Output = Response>) -> Response {
    let flight = Arc::new(InFlight {
        entry: Mutex::new(entry),
        recorded: AtomicBool::new(false),
    });
    let response = REQUEST.scope(flight.clone(), handler).await;
    if flight.recorded.load(Ordering::Acquire) {
        return response;
    }
    let mut entry = flight.entry.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let status = response.status();
    if is_refusal(status) {
        entry.outcome = format!("refused {}", status.as_u16());
        refusal(state, &entry).await;
        return response;
    }
    entry.outcome = if status.is_success() || status.is_redirection() {
        format!("no change ({})", status.as_u16())
    } else {
        format!("failed {}", status.as_u16())
    };
    let written = async {
        let mut conn = state.pool.acquire().await?;
        crate::audit::record(&mut conn, &entry).await
    };
    if let Err(err) = written.await {
        tracing::warn!(error = %err, action = entry.action, "an audit row was not written");
    }
    response
}

/// 401 and 403: counted, one row per actor, action and outcome per minute.
pub fn is_refusal(status: StatusCode) -> bool {
    matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
}

/// Counts a refusal (best effort: a server that cannot write, a standby,
/// still refuses).
pub async fn refusal(state: &AppState, entry: &Entry) {
    let written = async {
        let mut conn = state.pool.acquire().await?;
        crate::audit::refused(&mut conn, entry).await
    };
    if let Err(err) = written.await {
        tracing::debug!(error = %err, action = entry.action, "a refusal was not counted in the audit log");
    }
}

/// Appends the row of the request in progress, if any and not yet written,
/// on `tx` (the transaction about to commit). Returns the mark to set once
/// the commit succeeded.
pub(super) async fn record_in(tx: &mut sqlx::PgConnection) -> sqlx::Result<Option<Recorded>> {
    let Ok(flight) = REQUEST.try_with(Arc::clone) else {
        return Ok(None);
    };
    if flight.recorded.load(Ordering::Acquire) {
        return Ok(None);
    }
    let entry = flight.entry.lock().unwrap_or_else(|e| e.into_inner()).clone();
    crate::audit::record(tx, &entry).await?;
    Ok(Some(Recorded(flight)))
}

/// A row written on a transaction not yet committed.
pub(super) struct Recorded(Arc<InFlight>);

impl Recorded {
    /// The transaction committed: the request's row is written.
    pub(super) fn committed(self) {
        self.0.recorded.store(true, Ordering::Release);
    }
}
