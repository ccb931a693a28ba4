//! What `settled bench --payouts --chain` reports: the gas floor, each
//! saturation run, the idle broadcast latency, the targets, and the
//! markdown table.

use super::super::payouts::met;
use super::{ChainBenchOptions, BLOCK_TIME_SECS};

/// Block fill target for batches, gas used over the block gas limit.
pub const TARGET_BLOCK_FILL: f64 = 0.80;
/// Target: p99 from a payout's 201 to its transaction's broadcast, ms.
pub const TARGET_BROADCAST_P99_MS: f64 = 100.0;

/// A plain ERC-20 `transfer` from the hot wallet, gas from its receipt.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GasFloor {
    /// To an address that held none of the token.
    pub transfer_to_fresh: u64,
    /// To an address that already held some.
    pub transfer_to_funded: u64,
}

/// One saturation run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChainRun {
    /// `unbatched` or `batched`.
    pub mode: String,
    /// Payouts in the backlog.
    pub payouts: u64,
    /// Seconds from the backlog's commit to its last payout paid.
    pub seconds: f64,
    /// Payouts paid per second.
    pub per_sec: f64,
    /// Transactions that paid them.
    pub transactions: u64,
    /// Their gas, from their receipts.
    pub gas_used: u64,
    /// Gas per payout.
    pub gas_per_payout: f64,
    /// Blocks from the run's first to its last.
    pub blocks: u64,
    /// The block gas limit.
    pub block_gas_limit: u64,
    /// Mean gas used over the limit, of the blocks but the last.
    pub block_fill_mean: f64,
    /// Mean gas used over the limit at saturation: of the blocks between
    /// the first (which holds what was signed between the backlog's commit
    /// and its mining) and the last (the tail), when there are three or
    /// more; else as `block_fill_mean`.
    #[serde(default)]
    pub block_fill_saturated: f64,
    /// The fullest block's.
    pub block_fill_max: f64,
    /// Seconds from the backlog's commit to its last transaction signed ...
    #[serde(default)]
    pub last_signed_secs: f64,
    /// ... and broadcast.
    #[serde(default)]
    pub last_broadcast_secs: f64,
}

/// From a payout's 201 to its transaction's broadcast, ms.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BroadcastLatency {
    /// Payouts measured.
    pub samples: usize,
    /// Median (a broadcast before the client read its 201 counts as 0).
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Of those, from the 201 to the transaction's signing (its row's
    /// `created_at`): the median ...
    #[serde(default)]
    pub signed_p50_ms: f64,
    /// ... and the 99th percentile; the rest is the node's answer to the
    /// broadcast and its record.
    #[serde(default)]
    pub signed_p99_ms: f64,
    /// The slowest payout's story, read from the database after the run.
    #[serde(default)]
    pub slowest: Option<SlowestSample>,
}

/// The slowest payout of the latency measurement: where its time went.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SlowestSample {
    /// Its place among the samples, from 0.
    pub index: usize,
    /// The payout.
    pub payout_id: i64,
    /// From its 201 to its transaction's broadcast, ms.
    pub broadcast_ms: f64,
    /// From its 201 to its transaction's signing, ms.
    pub signed_ms: f64,
    /// Its delivery job's attempts ...
    pub attempts: i32,
    /// ... and the errors of those that failed.
    pub errors: serde_json::Value,
}

/// What the bench measured.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChainBenchReport {
    /// When it started.
    pub started_at: String,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The 1-minute load average before.
    pub load_before: String,
    /// The 1-minute load average after.
    pub load_after: String,
    /// The options.
    pub options: ChainBenchOptions,
    /// A plain transfer's gas.
    pub floor: GasFloor,
    /// The saturation runs, unbatched then batched.
    pub runs: Vec<ChainRun>,
    /// The idle broadcast latency.
    pub broadcast: BroadcastLatency,
}

impl ChainBenchReport {
    /// True when both targets are met.
    pub fn ok(&self) -> bool {
        self.batched_fill() >= TARGET_BLOCK_FILL && self.broadcast.p99_ms < TARGET_BROADCAST_P99_MS
    }

    fn batched_fill(&self) -> f64 {
        self.runs
            .iter()
            .find(|r| r.mode == "batched")
            .map_or(0.0, |r| r.block_fill_saturated)
    }

    /// The markdown rendering.
    pub fn markdown(&self) -> String {
        let o = &self.options;
        let mut out = format!(
            "## Payouts on-chain\n\n`{}`\n\n{} CPUs, load {} before and {} after; anvil --block-time {BLOCK_TIME_SECS}\n\n\
             {} deliverers (--concurrency {} --batch {}), --confirmations 1; plain ERC-20 transfer: \
             {} gas to a fresh address, {} to a funded one\n\n\
             | run | payouts | seconds | payouts/s | transactions | last signed, s | last broadcast, s | gas/payout | blocks | block fill mean | at saturation | max |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
            o.command, self.cpus, self.load_before, self.load_after, o.deliverers, o.concurrency, o.batch,
            self.floor.transfer_to_fresh, self.floor.transfer_to_funded,
        );
        for r in &self.runs {
            out.push_str(&format!(
                "| {} | {} | {:.1} | {:.0} | {} | {:.1} | {:.1} | {:.0} | {} | {:.0}% | {:.0}% | {:.0}% |\n",
                r.mode,
                r.payouts,
                r.seconds,
                r.per_sec,
                r.transactions,
                r.last_signed_secs,
                r.last_broadcast_secs,
                r.gas_per_payout,
                r.blocks,
                r.block_fill_mean * 100.0,
                r.block_fill_saturated * 100.0,
                r.block_fill_max * 100.0
            ));
        }
        let b = &self.broadcast;
        out.push_str(&format!(
            "\nbatched block fill at saturation (target ≥ {:.0}%: {})\n\n\
             idle, 201 → broadcast, {} payouts: p50 {:.1} ms, **p99 {:.1} ms**, max {:.1} ms \
             (target p99 < {:.0} ms: {}); of it, 201 → signed: p50 {:.1} ms, p99 {:.1} ms\n",
            TARGET_BLOCK_FILL * 100.0,
            met(self.batched_fill() >= TARGET_BLOCK_FILL),
            b.samples,
            b.p50_ms,
            b.p99_ms,
            b.max_ms,
            TARGET_BROADCAST_P99_MS,
            met(b.p99_ms < TARGET_BROADCAST_P99_MS),
            b.signed_p50_ms,
            b.signed_p99_ms,
        ));
        if let Some(slow) = &b.slowest {
            out.push_str(&format!(
                "\nslowest: sample {} (payout {}), {:.1} ms to broadcast, {:.1} ms to signed; its job took {} attempt(s), errors {}\n",
                slow.index, slow.payout_id, slow.broadcast_ms, slow.signed_ms, slow.attempts, slow.errors
            ));
        }
        out
    }
}
