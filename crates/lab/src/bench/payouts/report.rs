//! What the payout bench reports: each throughput run, the wake-up
//! latencies, each serve run, and the report against its targets.

use super::procs::met;
use super::{PayoutBenchOptions, TARGET_DELIVERED_PER_SEC, TARGET_WAKEUP_P99_MS};

/// One throughput run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ThroughputRun {
    /// Payouts in the backlog.
    pub payouts: u64,
    /// Seconds from the backlog's commit to the last payout leaving `queued`.
    pub seconds: f64,
    /// Payouts per second.
    pub per_sec: f64,
    /// Payouts per second as the provider saw their calls arrive (first to last).
    pub provider_per_sec: f64,
    /// CPU seconds the run took: the database server's processes, the
    /// deliverers, and the bench's own process (the simulator).
    pub cpu_postgres_secs: f64,
    /// The deliverers' CPU seconds.
    pub cpu_deliverers_secs: f64,
    /// The bench process's CPU seconds (the simulator, in it).
    pub cpu_simulator_secs: f64,
}

/// The wake-up latency, in milliseconds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Wakeup {
    /// Payouts measured.
    pub samples: usize,
    /// From the 201 to the provider call (a call that arrived before the
    /// client had read its 201 counts as 0).
    pub p50_ms: f64,
    /// Its 99th percentile.
    pub p99_ms: f64,
    /// Its largest.
    pub max_ms: f64,
    /// Calls that arrived before the client had read the 201.
    pub before_the_201: usize,
    /// From sending the request to the provider call, p50.
    pub from_request_p50_ms: f64,
    /// From sending the request to the provider call, p99.
    pub from_request_p99_ms: f64,
}

/// One serve run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServeRun {
    /// Seconds measured.
    pub seconds: f64,
    /// Payouts answered 201 per second.
    pub created_per_sec: f64,
    /// Payouts that left `queued` per second meanwhile.
    pub delivered_per_sec: f64,
    /// Payouts still queued when the clients stopped.
    pub queued_at_end: i64,
    /// Requests not answered 201.
    pub errors: u64,
}

/// What the bench measured.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PayoutBenchReport {
    /// When it started.
    pub started_at: String,
    /// PostgreSQL's version.
    pub server_version: String,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The 1-minute load average before and after.
    pub load_before: String,
    /// The 1-minute load average after.
    pub load_after: String,
    /// The options.
    pub options: PayoutBenchOptions,
    /// The throughput runs.
    pub throughput: Vec<ThroughputRun>,
    /// Their median payouts/s.
    pub throughput_median_per_sec: f64,
    /// The wake-up latency.
    pub wakeup: Wakeup,
    /// The serve runs.
    pub serve: Vec<ServeRun>,
    /// Their median 201s/s.
    pub serve_median_per_sec: f64,
    /// Jobs the deliverers snoozed (waiting on the limiter or the
    /// provider), from their exit lines.
    pub deliverer_lines: Vec<String>,
}

impl PayoutBenchReport {
    /// True when both targets are met.
    pub fn ok(&self) -> bool {
        self.throughput_median_per_sec >= TARGET_DELIVERED_PER_SEC && self.wakeup.p99_ms < TARGET_WAKEUP_P99_MS
    }

    /// The markdown rendering.
    pub fn markdown(&self) -> String {
        let o = &self.options;
        let mut out = format!(
            "## Payouts\n\n`{}`\n\n{} CPUs, load {} before and {} after; {}\n\n\
             {} deliverers (--concurrency {} --batch {} --provider-concurrency {}), provider latency {} ms\n\n",
            o.command,
            self.cpus,
            self.load_before,
            self.load_after,
            self.server_version,
            o.deliverers,
            o.concurrency,
            o.batch,
            o.provider_concurrency,
            o.provider_latency_ms
        );
        out.push_str(
            "| delivery run | payouts | seconds | payouts/s | at the provider/s | CPU s: PostgreSQL | deliverers | simulator |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        for (i, r) in self.throughput.iter().enumerate() {
            out.push_str(&format!(
                "| {} | {} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} |\n",
                i + 1,
                r.payouts,
                r.seconds,
                r.per_sec,
                r.provider_per_sec,
                r.cpu_postgres_secs,
                r.cpu_deliverers_secs,
                r.cpu_simulator_secs
            ));
        }
        let w = &self.wakeup;
        out.push_str(&format!(
            "\nmedian delivery: **{:.0} payouts/s** (target ≥ {:.0}: {})\n\n\
             idle wake-up, 201 → provider call, {} payouts: p50 {:.1} ms, **p99 {:.1} ms**, max {:.1} ms \
             ({} calls before the client read its 201; from the request: p50 {:.1} ms, p99 {:.1} ms) \
             (target p99 < {:.0} ms: {})\n\n",
            self.throughput_median_per_sec,
            TARGET_DELIVERED_PER_SEC,
            met(self.throughput_median_per_sec >= TARGET_DELIVERED_PER_SEC),
            w.samples,
            w.p50_ms,
            w.p99_ms,
            w.max_ms,
            w.before_the_201,
            w.from_request_p50_ms,
            w.from_request_p99_ms,
            TARGET_WAKEUP_P99_MS,
            met(w.p99_ms < TARGET_WAKEUP_P99_MS),
        ));
        out.push_str(&format!(
            "| serve run ({} servers, {} clients) | seconds | 201s/s | delivered/s | queued at the end | errors |\n\
             |---|---|---|---|---|---|\n",
            o.servers, o.clients
        ));
        for (i, r) in self.serve.iter().enumerate() {
            out.push_str(&format!(
                "| {} | {:.1} | {:.0} | {:.0} | {} | {} |\n",
                i + 1,
                r.seconds,
                r.created_per_sec,
                r.delivered_per_sec,
                r.queued_at_end,
                r.errors
            ));
        }
        out.push_str(&format!(
            "\nmedian through serve: **{:.0} payouts/s**\n\ndeliverers at exit:\n",
            self.serve_median_per_sec
        ));
        for line in &self.deliverer_lines {
            out.push_str(&format!("- {line}\n"));
        }
        out
    }
}
