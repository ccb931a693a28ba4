//! The engine's metric names (recorded through the `metrics` facade; the
//! application installs the recorder and may add a prefix there). Every
//! histogram carries a `mode` label, `tx` or `leased`.

/// Seconds one claim statement took (for a handler with a chunk statement,
/// [`crate::raw::ChunkSql`], that statement: claim, status change and effects).
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
