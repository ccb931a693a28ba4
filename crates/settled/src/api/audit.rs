//! The audit log of the server's requests, driven by the table of routes:
//! [`super::auth::authorize`] hands every request of a route that acts (a
//! POST behind a role) to [`around`], and counts every refusal (401, 403)
//! with [`refusal`] (in memory, written once a second per kind). A request
//! that acts writes its row inside the transaction of its effect:
//! [`super::commit`], the one commit of the API's and the dashboard's
//! writes, appends the row of the request in progress (held in a
//! task-local while its handler runs) before COMMIT. A request that
//! committed nothing (refused, invalid, answered from an idempotency key)
//! gets its row afterwards, on its own. Handlers may name what they acted
//! on ([`set_target`]) or how it ended ([`set_outcome`]). Never: a row for
//! a read that was allowed, or a row the roles could change.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use axum::response::Response;

use super::AppState;
use crate::audit::Entry;

/// The actor of a request that carried no token.
pub(crate) const ANONYMOUS: &str = "anonymous";
/// The actor of a request whose token is unknown or revoked.
pub(crate) const UNKNOWN_TOKEN: &str = "unknown-token";

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
pub(crate) fn set_target(target: impl Into<String>) {
    let target = target.into();
    with_entry(|e| e.target = target);
}

/// Says how the request in progress ended, when its commit is not plainly
/// [`crate::audit::OK`] (a refusal stored under an idempotency key).
pub(crate) fn set_outcome(outcome: impl Into<String>) {
    let outcome = outcome.into();
    with_entry(|e| e.outcome = outcome);
}

/// Runs `handler` for the request `entry` describes; writes its row
/// afterwards unless its commit did.
pub(crate) async fn around(
    state: &AppState,
    entry: Entry,
    handler: impl std::future::Future<Output = Response>,
) -> Response {
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
pub(crate) fn is_refusal(status: StatusCode) -> bool {
    matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
}

/// Counts a refusal: in memory, written by [`keep_writing_refusals`] (at
/// most one write per actor, action and outcome per
/// [`REFUSALS_WRITE_INTERVAL`]), so a flood of refused requests neither
/// contends on one row nor takes the connections payouts need.
pub(crate) async fn refusal(state: &AppState, entry: &Entry) {
    state.refusals.add(entry);
}

/// How often counted refusals are written.
pub(crate) const REFUSALS_WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Distinct actor, action and outcome triples held between writes; more
/// are dropped (and logged). Routes and token names bound them far below.
pub(crate) const REFUSALS_PENDING_MAX: usize = 10_000;

/// Refusals counted since the last write, by actor, action and outcome
/// (with the first target seen).
#[derive(Debug, Default)]
pub struct Refusals {
    pending: Mutex<HashMap<RefusalKind, (String, i64)>>,
}

/// What refusals are counted by: actor, action, outcome.
type RefusalKind = (String, String, String);

impl Refusals {
    fn add(&self, entry: &Entry) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let key = (entry.actor.clone(), entry.action.clone(), entry.outcome.clone());
        if let Some((_, count)) = pending.get_mut(&key) {
            *count += 1;
        } else if pending.len() < REFUSALS_PENDING_MAX {
            pending.insert(key, (entry.target.clone(), 1));
        } else {
            tracing::warn!(
                actor = entry.actor,
                action = entry.action,
                "a refusal was not counted: too many kinds pending"
            );
        }
    }

    fn take(&self) -> Vec<(Entry, i64)> {
        let taken = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        taken
            .into_iter()
            .map(|((actor, action, outcome), (target, count))| {
                let entry = Entry {
                    actor,
                    action,
                    target,
                    outcome,
                };
                (entry, count)
            })
            .collect()
    }
}

/// Writes the refusals counted so far (best effort: a server that cannot
/// write, a standby, still refuses; what could not be written is logged).
pub(crate) async fn write_refusals(state: &AppState) {
    let taken = state.refusals.take();
    if taken.is_empty() {
        return;
    }
    let written = async {
        let mut conn = state.pool.acquire().await?;
        for (entry, count) in &taken {
            crate::audit::refused(&mut conn, entry, *count).await?;
        }
        Ok::<_, sqlx::Error>(())
    };
    if let Err(err) = written.await {
        tracing::debug!(error = %err, kinds = taken.len(), "refusals were not counted in the audit log");
    }
}

/// Writes counted refusals every [`REFUSALS_WRITE_INTERVAL`], for ever.
pub(crate) async fn keep_writing_refusals(state: AppState) {
    let mut tick = tokio::time::interval(REFUSALS_WRITE_INTERVAL);
    loop {
        tick.tick().await;
        write_refusals(&state).await;
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
