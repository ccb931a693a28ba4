//! The engine's metric names (recorded through the `metrics` facade; the
//! application installs the recorder and may add a prefix there). Every
//! histogram carries a `mode` label, `tx` or `leased`.
//!
//! Its spans are plain `tracing` spans (`queue.enqueue`, `queue.claim`,
//! `queue.job`, `queue.handler`, `queue.complete`, `run.start`,
//! `run.finish`); the application's subscriber decides where they go. A
//! job's stored W3C `traceparent` is continued through [`TraceHooks`], which
//! the application installs with the tracing backend it chose: the engine
//! never depends on one, and without hooks it does nothing more.

/// Seconds one claim statement took (for a handler with a chunk statement,
/// [`crate::ChunkSql`], that statement: claim, status change and effects).
pub const CLAIM_DURATION: &str = "work_queue_claim_duration_seconds";
/// Seconds the application's handler took on one chunk (tx, handlers without
/// a chunk statement) or item (leased).
pub const HANDLER_DURATION: &str = "work_queue_handler_duration_seconds";
/// Continuous queues: seconds from when a job could run (its enqueue, or
/// its `not_before`) to its claim, on the database's clock; label `queue`.
pub const PICKUP_LATENCY: &str = "work_queue_pickup_latency_seconds";
/// Continuous queues: jobs by what became of them; labels `queue` and
/// `outcome` (settled, retried, failed, snoozed, fence_rejected, rescued,
/// released, pruned).
pub const JOBS: &str = "work_queue_jobs_total";

/// How the application's tracing backend continues and propagates W3C
/// trace contexts, for the engine, which knows none.
#[derive(Debug, Clone, Copy)]
pub struct TraceHooks {
    /// Makes `span`, not yet entered, a child of the W3C `traceparent`
    /// (a job's stored trace context), so the job's work joins the trace
    /// that enqueued it.
    pub continue_from: fn(span: &tracing::Span, traceparent: &str),
    /// The current span's W3C `traceparent`, stored with a job enqueued
    /// without one (None: no trace is being recorded).
    pub current: fn() -> Option<String>,
}

static TRACE_HOOKS: std::sync::OnceLock<TraceHooks> = std::sync::OnceLock::new();

/// Installs the process's [`TraceHooks`], once; false if some were installed
/// already (they stay).
pub fn install_trace_hooks(hooks: TraceHooks) -> bool {
    TRACE_HOOKS.set(hooks).is_ok()
}

/// Continues `traceparent` as `span`'s parent, when hooks are installed.
pub(crate) fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    if let (Some(hooks), Some(traceparent)) = (TRACE_HOOKS.get(), traceparent) {
        (hooks.continue_from)(span, traceparent);
    }
}

/// The current trace context to store with a new job, when hooks are installed.
pub(crate) fn current_traceparent() -> Option<String> {
    TRACE_HOOKS.get().and_then(|hooks| (hooks.current)())
}
