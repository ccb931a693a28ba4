//! A nonce given up, on a real node (anvil, mining only when the test
//! says): a transaction that can never be valid has its nonce filled by a
//! zero-value transfer from the hot wallet to itself, and its payout is
//! signed again under a new nonce only once that filler is confirmed at
//! depth. If the original is mined instead of the filler, the original
//! counts and nothing is signed again (the chain model's
//! `filler_confirmed` guard; its counterexample replayed here).

use crate::chain_support;
use crate::common;

use std::time::Duration;

use alloy_primitives::{Address, U256};
use chain_support::{count, deliver, mine, mine_until_paid, queued_payouts, rpc, wait_txs, TestChain, HOT_WALLET};
use common::{wait_until, Env};
use serde_json::json;

const CONFIRMATIONS: u32 = 3;
/// Under the rail's gas limit of a transfer (100,000), over a filler's (21,000).
const BLOCK_GAS_LIMIT_LOW: u64 = 90_000;
const BLOCK_GAS_LIMIT_USUAL: u64 = 30_000_000;
/// Long enough for the follower of heads (every 500 ms) to act several times.
const FOLLOWER_ROUNDS_MS: u64 = 2_000;

async fn block_gas_limit(chain: &TestChain, gas: u64) {
    rpc(&chain.url(), "evm_setBlockGasLimit", json!([format!("{gas:#x}")])).await;
}

async fn state_of_nonce(env: &Env, nonce: i64) -> String {
    env.scalar_text(&format!("SELECT state FROM settlement.chain_txs WHERE nonce = {nonce}"))
        .await
}

/// The hash of the attempt of the transaction under nonce 0 that is (or
/// is not) its filler.
async fn attempt_hash(env: &Env, filler: bool) -> String {
    env.scalar_text(&format!(
        "SELECT a.hash FROM settlement.chain_tx_attempts a JOIN settlement.chain_txs t ON t.id = a.tx_id
         WHERE t.nonce = 0 AND a.filler = {filler} ORDER BY a.attempt LIMIT 1"
    ))
    .await
}

/// The one payout paid, by one transfer of its amount to its creator, and
/// the hot wallet's token balance down by that amount.
async fn paid_once(env: &Env, chain: &TestChain, creator: Address, balance_before: U256) {
    chain_support::paid_once(env, chain, creator).await;
    let hot: Address = HOT_WALLET.parse().unwrap();
    assert_eq!(chain.balance_of(hot).await, balance_before - U256::from(1000u32));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_the_node_refuses_as_never_valid_has_its_nonce_filled_and_is_signed_again_only_once_the_filler_is_confirmed(
) {
    let env = Env::new().await;
    let made = queued_payouts(&env, 1).await;
    let chain = TestChain::unmined().await;
    let hot: Address = HOT_WALLET.parse().unwrap();
    let before = chain.balance_of(hot).await;
    // The transfer's gas limit is now above the block's: never valid here.
    block_gas_limit(&chain, BLOCK_GAS_LIMIT_LOW).await;
    let mut deliverer = deliver(&env, &chain, &chain.url(), CONFIRMATIONS, &[]);
    wait_until(60, "the nonce given up", || async {
        count(&env, "SELECT count(*) FROM settlement.chain_tx_attempts WHERE filler").await == 1
    })
    .await;
    let why = env
        .scalar_text("SELECT given_up_why FROM settlement.chain_txs WHERE nonce = 0")
        .await;
    assert!(why.contains("gas_limit"), "the node's refusal kept: {why}");
    mine(&chain).await;
    wait_until(60, "the filler included", || async {
        state_of_nonce(&env, 0).await == "included"
    })
    .await;
    mine(&chain).await;
    tokio::time::sleep(Duration::from_millis(FOLLOWER_ROUNDS_MS)).await;
    assert_eq!(
        count(&env, "SELECT count(*) FROM settlement.chain_txs").await,
        1,
        "nothing signed again while the filler is short of the confirmation depth"
    );
    block_gas_limit(&chain, BLOCK_GAS_LIMIT_USUAL).await;
    mine_until_paid(&env, &chain, 60).await;
    common::stop(&mut deliverer);
    assert_eq!(state_of_nonce(&env, 0).await, "filled");
    assert_eq!(state_of_nonce(&env, 1).await, "confirmed", "paid under the next nonce");
    let filler = rpc(
        &chain.url(),
        "eth_getTransactionByHash",
        json!([attempt_hash(&env, true).await]),
    )
    .await;
    assert_eq!(
        (filler["to"].as_str(), filler["value"].as_str()),
        (Some(HOT_WALLET), Some("0x0"))
    );
    assert_eq!(filler["nonce"], "0x0", "the filler took nonce 0 on the chain");
    paid_once(&env, &chain, made[0].1, before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_original_is_mined_instead_of_its_filler_the_original_counts_and_nothing_is_signed_again() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 1).await;
    let chain = TestChain::unmined().await;
    let hot: Address = HOT_WALLET.parse().unwrap();
    let before = chain.balance_of(hot).await;
    let mut deliverer = deliver(&env, &chain, &chain.url(), CONFIRMATIONS, &[]);
    wait_txs(&env, "nonce = 0 AND state = 'broadcast'", 1).await;
    let mut give_up = vec!["give-up", "--nonce", "0", "--why", "the test gives it up"];
    let flags = chain.flags(&chain.url(), CONFIRMATIONS);
    give_up.extend(flags.iter().map(String::as_str));
    env.run_ok(&give_up);
    // The filler replaced the original in this node's pool; the original,
    // still held elsewhere in the network, comes back and is mined.
    rpc(
        &chain.url(),
        "anvil_dropTransaction",
        json!([attempt_hash(&env, true).await]),
    )
    .await;
    let original: Vec<u8> = sqlx::query_scalar(
        "SELECT a.raw FROM settlement.chain_tx_attempts a WHERE NOT a.filler ORDER BY a.attempt LIMIT 1",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let raw = format!("0x{}", alloy_primitives::hex::encode(original));
    rpc(&chain.url(), "eth_sendRawTransaction", json!([raw])).await;
    mine(&chain).await;
    mine_until_paid(&env, &chain, 60).await;
    tokio::time::sleep(Duration::from_millis(FOLLOWER_ROUNDS_MS)).await;
    mine(&chain).await;
    common::stop(&mut deliverer);
    paid_once(&env, &chain, made[0].1, before).await;
    assert_eq!(state_of_nonce(&env, 0).await, "confirmed", "the original counts");
    let mined = env
        .scalar_text("SELECT mined_hash FROM settlement.chain_txs WHERE nonce = 0")
        .await;
    assert_eq!(mined, attempt_hash(&env, false).await);
    assert_eq!(
        count(&env, "SELECT count(*) FROM settlement.chain_txs").await,
        1,
        "nothing signed again"
    );
}
