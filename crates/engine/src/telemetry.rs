//! The engine's metric names (recorded through the `metrics` facade; the
//! application installs the recorder and may add a prefix there). Every
//! histogram carries a `mode` label, `tx` or `leased`.

/// Seconds one claim statement took (for a handler with a chunk statement,
/// [`crate::ChunkSql`], that statement: claim, status change and effects).
pub const CLAIM_DURATION: &str = "work_queue_claim_duration_seconds";
/// Seconds the application's handler took on one chunk (tx, handlers without
/// a chunk statement) or item (leased).
pub const HANDLER_DURATION: &str = "work_queue_handler_duration_seconds";
