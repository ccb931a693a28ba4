//! The spans of serving a queue: a `queue.claim` per claim statement, and
//! per claimed job a `queue.job` (its time in this worker, from the claim
//! to what became of it) whose children are `queue.handler` (the
//! application's work) and `queue.complete` (the completion). A job's span
//! continues the trace the job was enqueued in (its stored `traceparent`,
//! through the application's [`crate::raw::telemetry::TraceHooks`]) and
//! links to its claim, which took jobs of many traces. With no subscriber
//! interested, every span here is disabled and nothing is built.

use std::collections::HashMap;
use std::time::Duration;

use tracing::Span;

use super::super::{ClaimedJob, Queue};

/// The span of one claim statement; `jobs` is recorded when it answers.
pub(super) fn claim(queue: &Queue, mode: &'static str, batch: u32) -> Span {
    tracing::info_span!(
        "queue.claim",
        queue = queue.name(),
        mode,
        batch,
        jobs = tracing::field::Empty
    )
}

/// The spans of the jobs one claim took, by key.
pub(super) struct JobSpans {
    queue: String,
    by_key: HashMap<String, Span>,
}

impl JobSpans {
    /// Opens a span for each job `claim` took: a child of the job's stored
    /// trace, linked to the claim. None when the claim's span is disabled.
    pub(super) fn open(queue: &Queue, claim: &Span, claimed: &[(ClaimedJob, Duration)]) -> JobSpans {
        let mut spans = JobSpans {
            queue: String::new(),
            by_key: HashMap::new(),
        };
        if claim.is_disabled() {
            return spans;
        }
        spans.queue = queue.name().to_string();
        claim.record("jobs", claimed.len());
        for (job, waited) in claimed {
            let span = tracing::info_span!(
                "queue.job",
                otel.kind = "consumer",
                queue = queue.name(),
                key = %job.key,
                attempt = job.attempt,
                fence = %job.fence,
                priority = job.priority,
                wait_ms = waited.as_millis() as u64,
                traceparent = job.traceparent.as_deref(),
                outcome = tracing::field::Empty,
            );
            crate::common::telemetry::continue_trace(&span, job.traceparent.as_deref());
            span.follows_from(claim);
            spans.by_key.insert(job.key.clone(), span);
        }
        spans
    }

    /// The span of the handler's work on `job` (disabled when the job has none).
    pub(super) fn handler(&self, job: &ClaimedJob) -> Span {
        match self.by_key.get(&job.key) {
            Some(parent) => tracing::info_span!(parent: parent, "queue.handler", queue = %self.queue, key = %job.key),
            None => Span::none(),
        }
    }

    /// Spans of the jobs' completion, one per job: open until dropped, so
    /// each covers the completion's transaction as its job saw it.
    pub(super) fn completing<'a>(&self, jobs: impl Iterator<Item = &'a ClaimedJob>) -> Vec<Span> {
        if self.by_key.is_empty() {
            return Vec::new();
        }
        jobs.filter_map(|job| {
            let parent = self.by_key.get(&job.key)?;
            Some(tracing::info_span!(parent: parent, "queue.complete", queue = %self.queue, key = %job.key))
        })
        .collect()
    }

    /// Records what became of `key`'s job: settled, fence_rejected,
    /// retried, failed, snoozed or released.
    pub(super) fn outcome(&self, key: &str, outcome: &'static str) {
        if let Some(span) = self.by_key.get(key) {
            span.record("outcome", outcome);
        }
    }
}
