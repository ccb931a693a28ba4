//! `settled bench --payouts --chain`: payouts paid on-chain, on an anvil
//! the bench starts (`--block-time 1`, its default block gas limit), with
//! the test token and the batch contract deployed from their checked-in
//! bytecode, real `settled deliver` and `settled serve` processes.
//!
//! 1. Gas floor: a plain ERC-20 `transfer` from the hot wallet to a fresh
//!    address and to an already funded one, read from their receipts.
//! 2. Saturation, unbatched then batched (`--batch-contract`,
//!    `--batch-max`): a backlog committed in one transaction, several
//!    deliverers; the clock runs from the commit to the last payout paid
//!    (`--confirmations 1`). Gas per payout from the receipts of the run's
//!    transactions; block fill, gas used over the block gas limit, of the
//!    run's blocks but its last (the tail).
//! 3. Broadcast latency on an idle system: payouts made one at a time
//!    through `settled serve`, each paid before the next; per payout, the
//!    time from its 201 (the client's clock) to its transaction's
//!    `broadcast_at` (the database's clock, the same machine).

use std::path::Path;
use std::time::{Duration, Instant};

use alloy_primitives::{Address, U256};
use alloy_sol_types::{SolCall, SolValue};
use anyhow::Context;
use serde_json::{json, Value};
use sqlx::PgPool;

use super::payouts::{load_average, next_payout_id, percentile, settled_balances, unix_us, wait_listening, wait_ready};
use crate::settled_command;
use settled::chain::abi::IERC20;
use settled::db::Database;
use settled_testkit::chain::{deploy, quantity, receipt, rpc, HOT_WALLET, HOT_WALLET_KEY, SUPPLY};
use settled_testkit::Anvil;

mod report;
pub use report::{
    BroadcastLatency, ChainBenchReport, ChainRun, GasFloor, SlowestSample, TARGET_BLOCK_FILL, TARGET_BROADCAST_P99_MS,
};

/// Seconds between two of anvil's blocks.
const BLOCK_TIME_SECS: &str = "1";
/// The API token of the bench's server.
const API_TOKEN: &str = "bench-token";
/// Each payout's amount, in the token's base units.
const AMOUNT: i64 = 1;
/// Pause between two payouts of the latency measurement, ms: the
/// deliverer goes idle (asleep on LISTEN) in between.
const IDLE_PAUSE_MS: u64 = 100;
/// A backlog not paid within this many seconds per hundred payouts (and
/// two minutes) fails the bench.
const PAID_SECS_PER_HUNDRED: u64 = 10;
/// Fewest creators seeded.
const CREATORS_MIN: u64 = 100;
/// What `settled bench --payouts --chain` measures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChainBenchOptions {
    /// `settled deliver` processes of the saturation runs.
    pub deliverers: u32,
    /// `settled deliver --concurrency`.
    pub concurrency: u32,
    /// `settled deliver --batch` (payouts per claim).
    pub batch: u32,
    /// `settled deliver --batch-max` of the batched run.
    pub batch_max: u32,
    /// Payouts per saturation run.
    pub backlog: u64,
    /// Payouts of the latency measurement.
    pub latency_samples: u32,
    /// The server (None: a private one started for the bench).
    #[serde(skip)]
    pub database_url: Option<String>,
    /// The command line.
    pub command: String,
}

fn check(opts: &ChainBenchOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=super::payouts::MAX_PAYOUT_PROCESSES).contains(&opts.deliverers),
        "--deliverers must be 1..={}",
        super::payouts::MAX_PAYOUT_PROCESSES
    );
    anyhow::ensure!(
        (1..=super::payouts::MAX_BACKLOG).contains(&opts.backlog),
        "--backlog must be 1..={}",
        super::payouts::MAX_BACKLOG
    );
    anyhow::ensure!((2..=1_000).contains(&opts.batch_max), "--batch-max must be 2..=1000");
    anyhow::ensure!(opts.latency_samples >= 1, "--latency-samples must be at least 1");
    Ok(())
}

/// Runs the on-chain payout bench on a fresh database and a fresh anvil.
pub async fn chain_payouts(opts: &ChainBenchOptions) -> anyhow::Result<ChainBenchReport> {
    check(opts)?;
    super::on_fresh_database(&opts.database_url, |url, scratch| async move {
        measure(opts, &url, &scratch).await
    })
    .await
}

/// The node, the token, the batch contract, the hot wallet's key file.
struct Node {
    anvil: Anvil,
    token: Address,
    batcher: Address,
    key_file: std::path::PathBuf,
}

impl Node {
    async fn start(scratch: &Path) -> anyhow::Result<Node> {
        use std::os::unix::fs::PermissionsExt;
        let anvil = tokio::task::spawn_blocking(|| Anvil::start(&["--block-time", BLOCK_TIME_SECS])).await?;
        let holder: Address = HOT_WALLET.parse()?;
        // Transfers to the zero address are refused by the token anyway.
        let args = (holder, U256::from(SUPPLY), Address::ZERO).abi_encode_params();
        let token = deploy(&anvil.url(), "TestToken", args).await;
        let batcher = deploy(&anvil.url(), "PayMany", Vec::new()).await;
        let key_file = scratch.join("hot-wallet.key");
        std::fs::write(&key_file, format!("{HOT_WALLET_KEY}\n"))?;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
        Ok(Node {
            anvil,
            token,
            batcher,
            key_file,
        })
    }

    fn url(&self) -> String {
        self.anvil.url()
    }

    /// `settled deliver`'s chain flags, batched or not.
    fn flags(&self, batch_max: Option<u32>) -> Vec<String> {
        let mut flags = vec![
            "--chain-rpc-url".to_string(),
            self.url(),
            "--token-address".into(),
            format!("{:#x}", self.token),
            "--signer-key-file".into(),
            self.key_file.display().to_string(),
            "--confirmations".into(),
            "1".into(),
        ];
        if let Some(max) = batch_max {
            flags.extend([
                "--batch-contract".to_string(),
                format!("{:#x}", self.batcher),
                "--batch-max".into(),
                max.to_string(),
            ]);
        }
        flags
    }

    /// A plain `transfer` of the token from the hot wallet (anvil holds its
    /// key), mined at once; its gas.
    async fn transfer_gas(&self, to: Address) -> u64 {
        let data = IERC20::transferCall {
            to,
            value: U256::from(1u32),
        }
        .abi_encode();
        let tx = json!([{"from": HOT_WALLET, "to": self.token, "data": format!("0x{}", alloy_primitives::hex::encode(data))}]);
        let hash = rpc(&self.url(), "eth_sendTransaction", tx).await;
        rpc(&self.url(), "evm_mine", json!([])).await;
        let r = receipt(&self.url(), hash.as_str().unwrap_or_default()).await;
        quantity(&r["gasUsed"])
    }

    /// The plain transfers, before any deliverer reads the hot wallet's nonce.
    async fn floor(&self) -> GasFloor {
        let fresh = Address::repeat_byte(0x5e);
        let transfer_to_fresh = self.transfer_gas(fresh).await;
        GasFloor {
            transfer_to_fresh,
            transfer_to_funded: self.transfer_gas(fresh).await,
        }
    }
}

/// The bench's `settled deliver` and `settled serve` processes, killed on drop.
struct Fleet {
    exe: std::path::PathBuf,
    url: String,
    children: Vec<tokio::process::Child>,
}

impl Fleet {
    fn spawn(&mut self, args: &[String], log: &Path) -> anyhow::Result<()> {
        let child = settled_command(&self.exe, &self.url, log)?
            .args(args)
            .env("SETTLED_API_TOKEN", API_TOKEN)
            .spawn()?;
        self.children.push(child);
        Ok(())
    }

    /// `n` deliverers on the chain, each waited for until it listens.
    async fn deliverers(
        &mut self,
        pool: &PgPool,
        n: u32,
        opts: &ChainBenchOptions,
        chain: Vec<String>,
        scratch: &Path,
    ) -> anyhow::Result<()> {
        for i in 0..n {
            let mut args: Vec<String> = ["deliver", "--concurrency", &opts.concurrency.to_string()]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.extend([
                "--batch".to_string(),
                opts.batch.to_string(),
                "--shutdown-grace-ms".into(),
                "2000".into(),
            ]);
            args.extend(chain.iter().cloned());
            self.spawn(&args, &scratch.join(format!("deliver-{}-{i}.log", self.children.len())))?;
        }
        wait_listening(pool, n).await
    }

    /// SIGTERM to each, then its exit awaited.
    async fn stop(&mut self) {
        for child in &mut self.children {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGTERM);
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
        }
        self.children.clear();
    }
}

async fn measure(opts: &ChainBenchOptions, url: &str, scratch: &Path) -> anyhow::Result<ChainBenchReport> {
    let load_before = load_average();
    let started_at = chrono::Utc::now().to_rfc3339();
    let exe = std::env::current_exe().context("locating the settled binary")?;
    let db = Database::open_url(url, 8, "settled-bench").await?;
    let node = Node::start(scratch).await?;
    let floor = node.floor().await;
    let creators = creators(&db.pool, &exe, url, opts.backlog * 2).await?;
    let mut fleet = Fleet {
        exe,
        url: url.to_string(),
        children: Vec::new(),
    };
    let mut runs = Vec::new();
    for (i, (mode, batch)) in [("unbatched", None), ("batched", Some(opts.batch_max))]
        .into_iter()
        .enumerate()
    {
        fleet
            .deliverers(&db.pool, opts.deliverers, opts, node.flags(batch), scratch)
            .await?;
        let recipients: Vec<String> = creators
            .iter()
            .cycle()
            .skip(i * opts.backlog as usize)
            .take(opts.backlog as usize)
            .cloned()
            .collect();
        let run = saturation(&db.pool, &node, mode, &recipients).await?;
        eprintln!(
            "bench: chain: {mode}: {} payouts in {:.1} s, {:.0}/s, {:.0} gas each",
            run.payouts, run.seconds, run.per_sec, run.gas_per_payout
        );
        runs.push(run);
        fleet.stop().await;
    }
    fleet
        .deliverers(&db.pool, 1, opts, node.flags(Some(opts.batch_max)), scratch)
        .await?;
    let base = serve(&mut fleet, scratch).await?;
    let broadcast = broadcast_latency(&db.pool, &base, &creators, opts.latency_samples).await?;
    fleet.stop().await;
    db.close().await?;
    Ok(ChainBenchReport {
        started_at,
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        load_before,
        load_after: load_average(),
        options: opts.clone(),
        floor,
        runs,
        broadcast,
    })
}

/// Seeds and settles at least `n` creators; those with a balance enough
/// for the two payouts a creator may get (cycled over a short list).
async fn creators(pool: &PgPool, exe: &Path, url: &str, n: u64) -> anyhow::Result<Vec<String>> {
    let n = n.clamp(CREATORS_MIN, settled::seed::MAX_SEED_CREATORS);
    settled_balances(pool, exe, url, n, 1000).await
}

/// `settled serve`, waited for until ready; its base URL.
async fn serve(fleet: &mut Fleet, scratch: &Path) -> anyhow::Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let base = format!("http://127.0.0.1:{port}");
    fleet.spawn(
        &["serve".into(), "--bind".into(), format!("127.0.0.1:{port}")],
        &scratch.join("serve.log"),
    )?;
    wait_ready(&base).await?;
    Ok(base)
}

/// Commits one payout of [`AMOUNT`] to each of `recipients` in one
/// transaction; the first payout's id and the commit's time (epoch s).
async fn commit_backlog(pool: &PgPool, recipients: &[String], tag: &str) -> anyhow::Result<(i64, f64)> {
    let mut tx = pool.begin().await?;
    let first = next_payout_id(&mut tx).await?;
    let made: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE d.outcome = 'paid')
         FROM unnest($1::text[]) WITH ORDINALITY AS r(creator, i)
         CROSS JOIN LATERAL settlement.debit_for_payout(r.creator, $2, 'chain-bench-' || $3 || '-' || r.i, 'bench',
             NULL, NULL, NULL) AS d",
    )
    .bind(recipients) // $1
    .bind(AMOUNT) // $2
    .bind(tag) // $3
    .fetch_one(&mut *tx)
    .await?;
    anyhow::ensure!(
        made == recipients.len() as i64,
        "the backlog made {made} of {} payouts",
        recipients.len()
    );
    tx.commit().await?;
    let committed: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await?;
    Ok((first, committed))
}

/// Waits until every payout from `first` on is paid, for at most `secs`.
async fn wait_paid(pool: &PgPool, first: i64, secs: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM settlement.payouts WHERE id >= $1 AND status <> 'paid'")
                .bind(first) // $1
                .fetch_one(pool)
                .await?;
        if left == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{left} payouts still not paid after {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A backlog paid to `recipients` by the running deliverers.
async fn saturation(pool: &PgPool, node: &Node, mode: &str, recipients: &[String]) -> anyhow::Result<ChainRun> {
    let n = recipients.len() as u64;
    let (first, committed) =
        commit_backlog(pool, recipients, &format!("{mode}-{}", uuid::Uuid::new_v4().simple())).await?;
    wait_paid(pool, first, 120 + n * PAID_SECS_PER_HUNDRED / 100).await?;
    let last: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(at))::float8 FROM settlement.payout_history WHERE payout_id >= $1 AND to_state = 'paid'",
    )
    .bind(first) // $1
    .fetch_one(pool)
    .await?;
    let txs: Vec<(String, i64, f64, Option<f64>)> = sqlx::query_as(
        "SELECT t.mined_hash, t.block_number, extract(epoch FROM t.created_at)::float8,
                extract(epoch FROM t.broadcast_at)::float8
         FROM settlement.chain_txs t
         WHERE t.id IN (SELECT tx_id FROM settlement.chain_tx_payouts WHERE payout_id >= $1 AND NOT given_up)",
    )
    .bind(first) // $1
    .fetch_all(pool)
    .await?;
    let mut gas_used = 0;
    for (hash, ..) in &txs {
        gas_used += quantity(&receipt(&node.url(), hash).await["gasUsed"]);
    }
    let low = txs
        .iter()
        .map(|t| t.1)
        .min()
        .context("the backlog has no transaction")? as u64;
    let high = txs.iter().map(|t| t.1).max().unwrap_or_default() as u64;
    let (block_gas_limit, fills) = block_fills(&node.url(), low, high).await;
    let seconds = (last - committed).max(1e-6);
    Ok(ChainRun {
        mode: mode.to_string(),
        payouts: n,
        seconds,
        per_sec: n as f64 / seconds,
        transactions: txs.len() as u64,
        gas_used,
        gas_per_payout: gas_used as f64 / n as f64,
        blocks: high - low + 1,
        block_gas_limit,
        block_fill_mean: mean(&fills),
        block_fill_saturated: if fills.len() >= 2 {
            mean(&fills[1..])
        } else {
            mean(&fills)
        },
        block_fill_max: fills.iter().copied().fold(0.0, f64::max),
        last_signed_secs: txs.iter().map(|t| t.2 - committed).fold(0.0, f64::max),
        last_broadcast_secs: txs
            .iter()
            .filter_map(|t| t.3)
            .map(|at| at - committed)
            .fold(0.0, f64::max),
    })
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The block gas limit, and gas used over it of blocks `low..=high` but
/// the last (the tail of a backlog), or of the one block.
async fn block_fills(url: &str, low: u64, high: u64) -> (u64, Vec<f64>) {
    let (mut limit, mut fills) = (0, Vec::new());
    for number in low..=high.max(low + 1) - 1 {
        let block: Value = rpc(url, "eth_getBlockByNumber", json!([format!("{number:#x}"), false])).await;
        limit = quantity(&block["gasLimit"]);
        fills.push(quantity(&block["gasUsed"]) as f64 / limit as f64);
    }
    (limit, fills)
}

/// Payouts one at a time through `base`, each paid before the next; the
/// time from each 201 to its transaction's broadcast.
async fn broadcast_latency(
    pool: &PgPool,
    base: &str,
    creators: &[String],
    samples: u32,
) -> anyhow::Result<BroadcastLatency> {
    let http = reqwest::Client::new();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (mut ms, mut signed_ms, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..samples as usize {
        tokio::time::sleep(Duration::from_millis(IDLE_PAUSE_MS)).await;
        let r = http
            .post(format!("{base}/v1/payouts"))
            .bearer_auth(API_TOKEN)
            .header("Idempotency-Key", format!("chain-wake-{tag}-{i}"))
            .json(&json!({ "creator": creators[i % creators.len()], "amount": AMOUNT.to_string() }))
            .send()
            .await?;
        let answered_us = unix_us();
        anyhow::ensure!(r.status() == 201, "a payout answered {}", r.status());
        let id = r.json::<Value>().await?["id"].as_i64().context("a 201 without an id")?;
        wait_paid(pool, id, 60).await?;
        let (signed_us, broadcast_us): (f64, f64) = sqlx::query_as(
            "SELECT extract(epoch FROM t.created_at)::float8 * 1e6, extract(epoch FROM t.broadcast_at)::float8 * 1e6
             FROM settlement.chain_tx_payouts p
             JOIN settlement.chain_txs t ON t.id = p.tx_id WHERE p.payout_id = $1 AND NOT p.given_up",
        )
        .bind(id) // $1
        .fetch_one(pool)
        .await?;
        ms.push(((broadcast_us - answered_us as f64) / 1e3).max(0.0));
        signed_ms.push(((signed_us - answered_us as f64) / 1e3).max(0.0));
        ids.push(id);
    }
    let slowest = match (0..ms.len()).max_by(|&a, &b| ms[a].total_cmp(&ms[b])) {
        Some(index) => {
            let (attempts, errors): (i32, Value) =
                sqlx::query_as("SELECT attempt, errors FROM settlement.payout_jobs WHERE payout_id = $1")
                    .bind(ids[index]) // $1
                    .fetch_one(pool)
                    .await?;
            Some(SlowestSample {
                index,
                payout_id: ids[index],
                broadcast_ms: ms[index],
                signed_ms: signed_ms[index],
                attempts,
                errors,
            })
        }
        None => None,
    };
    ms.sort_by(f64::total_cmp);
    signed_ms.sort_by(f64::total_cmp);
    Ok(BroadcastLatency {
        samples: ms.len(),
        p50_ms: percentile(&ms, 50.0),
        p99_ms: percentile(&ms, 99.0),
        max_ms: ms.last().copied().unwrap_or(0.0),
        signed_p50_ms: percentile(&signed_ms, 50.0),
        signed_p99_ms: percentile(&signed_ms, 99.0),
        slowest,
    })
}
