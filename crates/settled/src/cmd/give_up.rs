//! `settled give-up`.

use std::process::ExitCode;

use crate::chain::{give_up, Chain, ChainFlags};
use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;

/// Give up the hot wallet's transaction under a nonce: it can never be
/// valid (e.g. the wallet cannot fund its gas and will not be refilled),
/// and it blocks every payout signed after it.
///
/// Its nonce is filled by a zero-value transfer from the hot wallet to
/// itself, signed as one more attempt of the same transaction (same nonce,
/// fees raised enough to replace, past the fee cap if need be: 21,000 gas)
/// and stored before it is sent. A running `settled deliver` follows it:
/// if the original is mined after all, its payouts are paid; only once
/// the filler is confirmed at --confirmations are its payouts signed again
/// under new nonces. Exit 1 when no transaction under the nonce is waiting
/// to be mined (already mined, or none).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The nonce to give up.
    #[arg(long)]
    nonce: i64,
    /// Why, kept with the transaction (`chain_txs.given_up_why`).
    #[arg(long, default_value = "given up by an operator")]
    why: String,
    #[command(flatten)]
    chain: ChainFlags,
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_worker");

    async fn run(self, db: &Database) -> Outcome {
        let Some(chain) = Chain::connect(&db.pool, &self.chain).await? else {
            anyhow::bail!("give-up needs --chain-rpc-url, --token-address and --signer-key-file");
        };
        if give_up::give_up_nonce(&db.pool, &chain, self.nonce, &self.why).await? {
            println!(
                "nonce {} of {} given up: its filler is signed and sent; its payouts are signed again once it is confirmed",
                self.nonce,
                chain.wallet.address()
            );
            Ok(ExitCode::SUCCESS)
        } else {
            println!(
                "no transaction of {} under nonce {} is waiting to be mined",
                chain.wallet.address(),
                self.nonce
            );
            Ok(ExitCode::from(1))
        }
    }
}
