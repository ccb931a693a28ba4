//! `settled wallet`.

use alloy_primitives::{Address, Bytes};
use alloy_sol_types::SolCall;

use crate::chain::abi::IERC20;
use crate::chain::store::{self, TxState};
use crate::chain::{HotWallet, Rpc};
use crate::cmd::{Outcome, ReadOnly};
use crate::db::Database;

/// Show the hot wallet of the chain rail: its address, its token and gas
/// balances, its next nonce in the database and on the node, and its
/// transactions in flight with their attempts and ages.
///
/// The wallet is the one of --signer-key-file (its address shown, never
/// its key), or else every sender settled signs for on the node's chain.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The node's JSON-RPC.
    #[arg(long, env = "SETTLED_CHAIN_RPC_URL")]
    chain_rpc_url: String,
    /// The ERC-20 token paid out.
    #[arg(long, env = "SETTLED_TOKEN_ADDRESS", value_parser = crate::chain::parse_address)]
    token_address: Address,
    /// The hot wallet's key file (only its address is used and shown).
    #[arg(long, env = "SETTLED_SIGNER_KEY_FILE")]
    signer_key_file: Option<std::path::PathBuf>,
}

impl ReadOnly for Args {
    async fn read(self, db: &Database) -> Outcome {
        let rpc = Rpc::new(&self.chain_rpc_url)?;
        let chain_id = rpc.chain_id().await?;
        let mut conn = db.pool.acquire().await?;
        let senders: Vec<Address> = match &self.signer_key_file {
            Some(path) => vec![HotWallet::from_key_file(path)?.address()],
            None => sqlx::query_scalar::<_, String>("SELECT sender FROM settlement.chain_senders WHERE chain_id = $1")
                .bind(chain_id as i64) // $1
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(|s| s.parse())
                .collect::<Result<_, _>>()?,
        };
        for sender in senders {
            print!("{}", show(&mut conn, &rpc, chain_id, self.token_address, sender).await?);
        }
        Ok(std::process::ExitCode::SUCCESS)
    }
}

/// One wallet, as text.
async fn show(
    conn: &mut sqlx::PgConnection,
    rpc: &Rpc,
    chain_id: u64,
    token: Address,
    sender: Address,
) -> anyhow::Result<String> {
    let call = IERC20::balanceOfCall { owner: sender }.abi_encode();
    let tokens = IERC20::balanceOfCall::abi_decode_returns(&rpc.eth_call(token, Bytes::from(call)).await?)?;
    let gas = rpc.balance(sender).await?;
    let next: Option<i64> =
        sqlx::query_scalar("SELECT next_nonce FROM settlement.chain_senders WHERE chain_id = $1 AND sender = $2")
            .bind(chain_id as i64) // $1
            .bind(store::lower(sender)) // $2
            .fetch_optional(&mut *conn)
            .await?;
    let mined = rpc.nonce(sender, "latest").await?;
    let pending = rpc.nonce(sender, "pending").await?;
    let in_flight = store::in_flight(conn, chain_id, sender).await?;
    let mut out = format!(
        "wallet {} on chain {chain_id}\n  token {token:#x}: {tokens}\n  gas: {gas} wei\n  \
         next nonce: database {}, node {mined} mined, {pending} pending\n  in flight: {}\n",
        store::lower(sender),
        next.map_or_else(|| "none".to_string(), |n| n.to_string()),
        in_flight.len()
    );
    for tx in &in_flight {
        let mined_in = match (tx.state, tx.mined) {
            (TxState::Included, Some((block, _, hash))) => format!(", mined as {} in block {block}", store::hex(hash)),
            _ => String::new(),
        };
        let given_up = if tx.given_up {
            ", given up (newest attempt: its filler)"
        } else {
            ""
        };
        out.push_str(&format!(
            "    nonce {} {} (tx {}){given_up}, {} attempt(s), newest {} signed {:.1} s ago{mined_in}\n",
            tx.nonce,
            tx.state.as_str(),
            tx.id,
            tx.attempts.len(),
            store::hex(tx.latest().hash),
            tx.since_signed_ms as f64 / 1000.0
        ));
    }
    Ok(out)
}
