//! The chain rail: payouts paid by ERC-20 transfers from settled's hot
//! wallet, exactly once (docs/architecture.md, "The chain rail").
//!
//! ```text
//! payout queued ──► signed (write-ahead: nonce, bytes, hash stored) ──► broadcast ──► included ──► confirmed (depth N)
//!                                                         payout: sent ─┘        ▲    │    └────► reverted
//!                                                                 reorg: back ────┘────┘          payout: paid | failed (funds returned)
//! ```
//!
//! It owns the transaction's lifecycle beside the payout's: `sign.rs`
//! makes a transaction (the only place one is signed), `broadcast.rs`
//! sends stored bytes and reads the node's answer, `confirm.rs` follows
//! heads (inclusion, reorgs, the confirmation depth) and moves payouts
//! through the payout state machine's own functions, `rail.rs` is the
//! [`crate::payouts::Rail`] delivery calls, `store.rs` holds the
//! statements; `reconcile.rs` compares the chain with the payouts,
//! `watch.rs` records the wallet for the metrics, `metrics.rs` and
//! `listing.rs` are what `settled serve` reads. It never moves a payout but through `payouts::apply_words`,
//! and never signs a second transaction for a payout.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy_primitives::{Address, U256};
use sqlx::PgPool;

pub mod abi;
pub(crate) mod broadcast;
pub mod confirm;
pub mod give_up;
pub(crate) mod listing;
pub(crate) mod metrics;
pub(crate) mod rail;
pub(crate) mod reconcile;
pub(crate) mod rpc;
pub mod sign;
pub(crate) mod spent;
pub(crate) mod store;
pub(crate) mod wallet;
pub mod watch;

pub use rail::ChainRail;
pub(crate) use rpc::Rpc;
pub(crate) use wallet::HotWallet;

/// The confirmation depth by default: a payout is paid when its
/// transaction's block has this many blocks on it, itself included.
pub(crate) const DEFAULT_CONFIRMATIONS: u64 = 12;
/// The most settled pays per gas by default, in gwei.
pub const DEFAULT_FEE_CAP_GWEI: u64 = 500;
/// How often heads are followed.
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_millis(500);
/// A transaction sent this long ago and not mined is sent again (a node
/// that dropped or forgot it).
pub(crate) const REBROADCAST_AFTER: Duration = Duration::from_secs(10);

/// The chain flags of `settled deliver`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChainFlags {
    /// Pay payouts on-chain through this node's JSON-RPC (e.g.
    /// http://127.0.0.1:8545) instead of the HTTP provider.
    #[arg(long, env = "SETTLED_CHAIN_RPC_URL", requires_all = ["token_address", "signer_key_file"])]
    pub chain_rpc_url: Option<String>,
    /// The ERC-20 token paid out (0x + 40 hex digits).
    #[arg(long, env = "SETTLED_TOKEN_ADDRESS", requires = "chain_rpc_url", value_parser = parse_address)]
    pub token_address: Option<Address>,
    /// The hot wallet's private key, hex, in a file only its owner can read.
    #[arg(long, env = "SETTLED_SIGNER_KEY_FILE", requires = "chain_rpc_url")]
    pub signer_key_file: Option<PathBuf>,
    /// Blocks on top of a transaction's block, itself included, before its
    /// payouts are paid (or failed, if it reverted).
    #[arg(long, default_value_t = DEFAULT_CONFIRMATIONS, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub confirmations: u64,
    /// The most paid per gas, base fee and tip together, in gwei.
    #[arg(long, env = "SETTLED_CHAIN_FEE_CAP_GWEI", default_value_t = DEFAULT_FEE_CAP_GWEI,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub fee_cap_gwei: u64,
    /// A transaction sent and not mined this many seconds after its newest
    /// attempt was signed is replaced: the same nonce, both fees raised by
    /// at least 12.5% (or to the market), at most the fee cap.
    #[arg(long, env = "SETTLED_CHAIN_REPLACE_AFTER_SECS", default_value_t = DEFAULT_REPLACE_AFTER_SECS,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub replace_after_secs: u64,
    /// Pay up to --batch-max payouts in one transaction through this
    /// multi-transfer contract (contracts/PayMany.sol); the hot wallet
    /// approves it once, by a transaction of its own.
    #[arg(long, requires = "chain_rpc_url", value_parser = parse_address)]
    pub batch_contract: Option<Address>,
    /// Payouts per batch, 2..=1000.
    #[arg(long, default_value_t = DEFAULT_BATCH_MAX, requires = "batch_contract",
          value_parser = clap::value_parser!(u32).range(2..=1_000))]
    pub batch_max: u32,
    /// How often the hot wallet's gas balance is read from the node and
    /// recorded for `settled serve`'s metrics, in seconds.
    #[arg(long, env = "SETTLED_CHAIN_WATCH_EVERY_SECS", default_value_t = DEFAULT_WATCH_EVERY_SECS,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub watch_every_secs: u64,
    /// How often the chain's Transfer logs are reconciled with the payouts
    /// (as `settled reconcile --chain-rpc-url` does) and the mismatches
    /// recorded for the metrics, in seconds, by one deliverer of the fleet
    /// (the first to take the turn on the database's clock); 0: never by
    /// this one.
    #[arg(long, env = "SETTLED_CHAIN_RECONCILE_EVERY_SECS", default_value_t = DEFAULT_RECONCILE_EVERY_SECS,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    pub reconcile_every_secs: u64,
}

/// How often the gas balance is recorded by default, in seconds.
pub const DEFAULT_WATCH_EVERY_SECS: u64 = 30;
/// How often a deliverer reconciles with the chain by default, in seconds.
pub(crate) const DEFAULT_RECONCILE_EVERY_SECS: u64 = 600;

/// Payouts per batch by default.
pub const DEFAULT_BATCH_MAX: u32 = 100;

/// How long an unmined transaction waits before it is replaced, by default.
pub(crate) const DEFAULT_REPLACE_AFTER_SECS: u64 = 60;

/// Parses a contract or wallet address (any case).
pub(crate) fn parse_address(text: &str) -> Result<Address, String> {
    let address = crate::address::CreatorAddress::parse(text).map_err(|e| e.to_string())?;
    address.as_str().parse().map_err(|e| format!("{e}"))
}

/// The batch contract and how many payouts one call pays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// The multi-transfer contract (`contracts/PayMany.sol`).
    pub contract: Address,
    /// Payouts per transaction.
    pub max: u32,
}

/// A chain to pay on, connected: its node, the chain's id, the hot wallet,
/// the token, and the rules.
#[derive(Debug, Clone)]
pub struct Chain {
    /// The node.
    pub rpc: Rpc,
    /// The chain's id (signed into every transaction).
    pub chain_id: u64,
    /// The hot wallet.
    pub wallet: HotWallet,
    /// The token paid out.
    pub token: Address,
    /// The confirmation depth.
    pub confirmations: u64,
    /// The most paid per gas, in wei.
    pub fee_cap: u128,
    /// How long an unmined attempt waits before it is replaced.
    pub replace_after: Duration,
    /// Batches, when a batch contract is given.
    pub batch: Option<Batch>,
    /// How often the gas balance is recorded (`watch`).
    pub watch_every: Duration,
    /// How often the chain is reconciled (`watch`); never when `None`.
    pub reconcile_every: Option<Duration>,
    /// The fees read last and when ([`Chain::recent_fees`]).
    fees_read: Arc<Mutex<Option<(Instant, sign::Fees)>>>,
    /// A batch's measured cost, or when measuring it last failed
    /// ([`Chain::batch_gas_limit`]).
    batch_gas: Arc<Mutex<Result<sign::BatchGas, Option<Instant>>>>,
    /// The searches for the transactions that spent nonces with no
    /// receipt ([`spent`]).
    spent_looks: Arc<Mutex<spent::Looks>>,
}

/// How long after a failed measurement of a batch's cost it is tried again.
/// (A new deliverer's first batches wait about a block for the batch
/// contract's approval to be mined.)
pub(crate) const BATCH_GAS_MEASURE_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// How long fees read from the node serve new transactions: about a block
/// on a fast chain. A new transaction's fee cap is twice the base fee plus
/// the tip, room for six blocks of the base fee's largest rise (12.5%
/// each), so fees this old still get it mined.
pub(crate) const FEES_FRESH_FOR: Duration = Duration::from_secs(1);

impl Chain {
    /// Connects to the node of `flags`, reads the key, and makes sure the
    /// sender has its nonce row (starting from the node's count of its
    /// mined transactions, the first time).
    pub async fn connect(pool: &PgPool, flags: &ChainFlags) -> anyhow::Result<Option<Chain>> {
        let (Some(url), Some(token), Some(key_file)) =
            (&flags.chain_rpc_url, flags.token_address, &flags.signer_key_file)
        else {
            return Ok(None);
        };
        let wallet = HotWallet::from_key_file(key_file)?;
        let rpc = Rpc::new(url)?;
        let chain_id = rpc.chain_id().await?;
        let chain = Chain {
            rpc,
            chain_id,
            wallet,
            token,
            confirmations: flags.confirmations,
            fee_cap: u128::from(flags.fee_cap_gwei) * 1_000_000_000,
            replace_after: Duration::from_secs(flags.replace_after_secs),
            batch: flags.batch_contract.map(|contract| Batch {
                contract,
                max: flags.batch_max,
            }),
            watch_every: Duration::from_secs(flags.watch_every_secs),
            reconcile_every: (flags.reconcile_every_secs > 0).then(|| Duration::from_secs(flags.reconcile_every_secs)),
            fees_read: Arc::default(),
            batch_gas: Arc::new(Mutex::new(Err(None))),
            spent_looks: Arc::default(),
        };
        let mined = chain.rpc.nonce(chain.wallet.address(), "latest").await?;
        sqlx::query(
            "INSERT INTO settlement.chain_senders (chain_id, sender, next_nonce) VALUES ($1, $2, $3)
             ON CONFLICT (chain_id, sender) DO NOTHING",
        )
        .bind(chain_id as i64) // $1
        .bind(store::lower(chain.wallet.address())) // $2
        .bind(mined as i64) // $3
        .execute(pool)
        .await?;
        sign::ensure_approval(pool, &chain).await?;
        Ok(Some(chain))
    }

    /// The fees a new transaction is signed with: twice the newest base
    /// fee plus the node's suggested tip, at most the fee cap.
    pub async fn fees(&self) -> anyhow::Result<sign::Fees> {
        let base = self.rpc.latest().await?.base_fee_per_gas.unwrap_or(U256::ZERO);
        let tip = self.rpc.max_priority_fee().await?;
        let base: u128 = base
            .try_into()
            .map_err(|_| anyhow::anyhow!("base fee {base} out of range"))?;
        let tip: u128 = tip.try_into().map_err(|_| anyhow::anyhow!("tip {tip} out of range"))?;
        let max_fee = base.saturating_mul(2).saturating_add(tip).min(self.fee_cap);
        Ok(sign::Fees {
            max_fee_per_gas: max_fee.max(1),
            max_priority_fee_per_gas: tip.min(max_fee),
        })
    }

    /// The fees for a new transaction, read from the node at most once per
    /// [`FEES_FRESH_FOR`] (deliverers signing many batches a second ask the
    /// node once). A replacement or a filler reads [`Chain::fees`] fresh.
    pub(crate) async fn recent_fees(&self) -> anyhow::Result<sign::Fees> {
        if let Some((at, fees)) = *self.fees_read.lock().expect("fees") {
            if at.elapsed() < FEES_FRESH_FOR {
                return Ok(fees);
            }
        }
        let fees = self.fees().await?;
        *self.fees_read.lock().expect("fees") = Some((Instant::now(), fees));
        Ok(fees)
    }

    /// The gas limit of a batch of `n` payouts: the token's cost through
    /// the batch contract measured once ([`sign::BatchGas`]), with
    /// headroom; the most a batch is given while it cannot be measured
    /// (tried again every [`BATCH_GAS_MEASURE_AGAIN_AFTER`]).
    pub(crate) async fn batch_gas_limit(&self, n: u64) -> u64 {
        let due = match *self.batch_gas.lock().expect("batch gas") {
            Ok(gas) => return gas.limit(n),
            Err(last) => last.is_none_or(|at| at.elapsed() >= BATCH_GAS_MEASURE_AGAIN_AFTER),
        };
        let Some(batch) = self.batch.filter(|_| due) else {
            return sign::most_batch_gas(n);
        };
        let measured = sign::measure(self, batch).await;
        let mut kept = self.batch_gas.lock().expect("batch gas");
        match measured {
            Ok(gas) => {
                tracing::info!(
                    base = gas.base,
                    per_transfer = gas.per_transfer,
                    "a batch's gas measured"
                );
                *kept = Ok(gas);
                gas.limit(n)
            }
            Err(err) => {
                tracing::info!(error = %format!("{err:#}"), "a batch's gas not measured yet: batches get the most");
                *kept = Err(Some(Instant::now()));
                sign::most_batch_gas(n)
            }
        }
    }

    /// The payment id settled records for payout `payout_id` paid on this
    /// chain from this wallet: it names the payout, not a nonce or a hash,
    /// so it stays the payout's whatever attempt is mined.
    pub(crate) fn payment_id(&self, payout_id: i64) -> String {
        format!(
            "eip155:{}:{}:payout-{payout_id}",
            self.chain_id,
            store::lower(self.wallet.address())
        )
    }
}
