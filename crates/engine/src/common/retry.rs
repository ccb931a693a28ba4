//! The one retry decision every failure path shares (batch in-transaction,
//! leased, the rescuers; continuous jobs): a permanent error or the last
//! allowed attempt fails the item; otherwise it waits
//! `base * 2^(attempt-1)` ms, capped, times a jitter in [0.5, 1). Here are
//! the policy, what a failed attempt records and what a failure statement
//! decided; each queue's statements sit with the queue.

/// Default attempts before `failed`.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;

/// When a failed attempt may be retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts before an item goes to `failed` (counted from its
    /// `attempt_base`, which an operator's retry raises).
    pub max_attempts: i32,
    /// First backoff, in milliseconds (doubles per attempt).
    pub backoff_base_ms: u64,
    /// Longest backoff, in milliseconds.
    pub backoff_cap_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 300_000,
        }
    }
}

/// How many items a failure statement sent back to retry, and how many failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailOutcome {
    /// Back to `eligible`, to retry after a backoff.
    pub retried: u64,
    /// Now `failed`.
    pub failed: u64,
}

impl FailOutcome {
    pub(crate) fn count(statuses: &[String]) -> FailOutcome {
        let failed = statuses.iter().filter(|s| *s == "failed").count() as u64;
        FailOutcome {
            retried: statuses.len() as u64 - failed,
            failed,
        }
    }
}

/// The SET list of the retry decision. Arguments are SQL expressions;
/// `failed_not_before` is what `not_before` becomes when the item fails.
pub(crate) fn retry_set(
    attempt: &str,
    error: &str,
    permanent: &str,
    [max, base, cap]: [&str; 3],
    failed_not_before: &str,
) -> String {
    let gives_up = format!("{permanent} OR {attempt} - t.attempt_base >= {max}");
    format!(
        "status = CASE WHEN {gives_up} THEN 'failed' ELSE 'eligible' END,
         not_before = CASE WHEN {gives_up} THEN {failed_not_before}
             ELSE now() + least({cap}::float8, {base}::float8 * power(2, greatest({attempt} - t.attempt_base - 1, 0)))
                          * (0.5 + random() / 2) * interval '1 millisecond' END,
         last_error = {error}, lease_owner = NULL, lease_until = NULL, updated_at = now()"
    )
}

/// What a failed attempt records.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The error, stored in `last_error`.
    pub error: &'a str,
    /// True when retrying cannot help: the item fails at once.
    pub permanent: bool,
}
