//! The chain rail's faults on a real node (anvil) that mines only when the
//! test says (`--no-mining`, `evm_mine`), so each fault lands where it
//! must: a transfer stuck under a base fee that jumped is replaced under
//! its nonce, and whichever attempt is mined (the replacement, or the
//! original after the replacement was signed) is the one that counts; a
//! reorg takes an included transfer out of the chain, and it is sent again
//! and paid once. A nonce the node counts mined with no receipt for any
//! attempt is never replaced: the transaction that spent it is found in
//! the blocks (settled's own attempt: paid on its Transfer logs; a
//! transaction of the hot wallet not settled's: the payout signed again
//! under a new nonce and paid once), or, the node's history lost, the
//! transaction waits for an operator and reconcile names it. Each test
//! checks from the chain's `Transfer` logs.

use crate::chain_support;
use crate::common;

use std::time::Duration;

use alloy_primitives::{Address, U256};
use chain_support::{
    count, deliver, drop_newest_attempt, hide, mine, mine_until, mine_until_paid, paid_once, queued_payouts, rpc,
    wait_txs, Broadcasts, Deliverer, RpcProxy, TestChain, HOT_WALLET,
};
use common::{wait_until, Env};
use serde_json::json;

const GWEI: u64 = 1_000_000_000;

/// The next block's base fee, in gwei.
async fn next_base_fee(chain: &TestChain, gwei: u64) {
    rpc(
        &chain.url(),
        "anvil_setNextBlockBaseFeePerGas",
        json!([format!("{:#x}", gwei * GWEI)]),
    )
    .await;
}

/// The attempts of the one transaction, oldest first, and the one mined.
async fn attempts_and_mined(env: &Env) -> (Vec<String>, Option<String>) {
    let attempts: Vec<String> = sqlx::query_scalar("SELECT hash FROM settlement.chain_tx_attempts ORDER BY attempt")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    let mined: Option<String> = sqlx::query_scalar("SELECT mined_hash FROM settlement.chain_txs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    (attempts, mined)
}

/// One payout, its first attempt in the node's pool and not mined (the
/// node mines nothing until told; with `base_fee_jump`, a block is mined
/// whose base fee is above what the attempt offers); the deliverer
/// replaces it. The chain, the proxy the deliverer talks through, the
/// deliverer, the payout's creator.
async fn stuck(env: &Env, broadcasts: Broadcasts, base_fee_jump: bool) -> (TestChain, RpcProxy, Deliverer, Address) {
    let made = queued_payouts(env, 1).await;
    let chain = TestChain::unmined().await;
    let proxy = RpcProxy::start(chain.url()).await;
    proxy.set(broadcasts);
    let deliverer = deliver(env, &chain, &proxy.url, 2, &["--replace-after-secs", "1"]);
    wait_txs(env, "state = 'broadcast'", 1).await;
    if base_fee_jump {
        next_base_fee(&chain, 100).await;
        mine(&chain).await;
    }
    wait_until(60, "a replacement signed", || async {
        count(env, "SELECT count(*) FROM settlement.chain_tx_attempts").await >= 2
    })
    .await;
    (chain, proxy, deliverer, made[0].1)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_transfer_is_replaced_under_its_nonce_with_higher_fees_and_the_mined_replacement_counts() {
    let env = Env::new().await;
    let (chain, _proxy, mut deliverer, creator) = stuck(&env, Broadcasts::Pass, true).await;
    mine_until_paid(&env, &chain, 60).await;
    common::stop(&mut deliverer);
    let (attempts, mined) = attempts_and_mined(&env).await;
    assert!(attempts.len() >= 2, "{attempts:?}");
    assert_ne!(mined.as_deref(), Some(attempts[0].as_str()), "a replacement was mined");
    assert!(
        attempts.contains(&mined.clone().unwrap()),
        "the mined hash is one of its attempts"
    );
    let fees: Vec<(String, String)> = sqlx::query_as(
        "SELECT max_fee_per_gas::text, max_priority_fee_per_gas::text FROM settlement.chain_tx_attempts ORDER BY attempt",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    for pair in fees.windows(2) {
        let (old, new) = (&pair[0], &pair[1]);
        let raised = |o: &str, n: &str| n.parse::<u128>().unwrap() * 10 >= o.parse::<u128>().unwrap() * 11;
        assert!(
            raised(&old.0, &new.0) && raised(&old.1, &new.1),
            "both fees +10% at least: {fees:?}"
        );
    }
    let nonces: Vec<i64> = sqlx::query_scalar("SELECT nonce FROM settlement.chain_txs")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    assert_eq!(nonces, vec![0], "one nonce for every attempt");
    paid_once(&env, &chain, creator).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_original_is_mined_after_its_replacement_was_signed_the_original_counts() {
    let env = Env::new().await;
    // The replacement is stored, then lost on its way to the node.
    let (chain, _proxy, mut deliverer, creator) = stuck(&env, Broadcasts::OnlyTheFirst, false).await;
    mine_until_paid(&env, &chain, 60).await;
    common::stop(&mut deliverer);
    let (attempts, mined) = attempts_and_mined(&env).await;
    assert!(attempts.len() >= 2, "a replacement was signed: {attempts:?}");
    assert_eq!(
        mined.as_deref(),
        Some(attempts[0].as_str()),
        "the original was mined, and counts"
    );
    paid_once(&env, &chain, creator).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reorg_takes_an_included_transfer_out_and_it_is_sent_again_and_paid_once() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 1).await;
    // A token whose transfer returns no value, as some do in production.
    let chain = TestChain::start(&["--no-mining"], "NoReturnToken", Address::repeat_byte(0xee)).await;
    let mut deliverer = deliver(&env, &chain, &chain.url(), 4, &[]);
    wait_txs(&env, "state = 'broadcast'", 1).await;
    mine(&chain).await;
    wait_txs(&env, "state = 'included'", 1).await;
    let first_block: String = sqlx::query_scalar("SELECT block_hash FROM settlement.chain_txs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    mine(&chain).await;
    // Two blocks out, the transfer's among them; two empty ones instead.
    rpc(&chain.url(), "anvil_reorg", json!([2, []])).await;
    wait_until(60, "the reorg seen", || async {
        count(
            &env,
            "SELECT count(*) FROM settlement.chain_tx_history WHERE from_state = 'included' AND to_state = 'broadcast'",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'paid'").await,
        0,
        "not paid while its transfer was out of the chain"
    );
    mine_until_paid(&env, &chain, 60).await;
    common::stop(&mut deliverer);
    let final_block: String =
        sqlx::query_scalar("SELECT block_hash FROM settlement.chain_txs WHERE state = 'confirmed'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_ne!(final_block, first_block, "paid in the block of the new chain");
    let transfers = chain.transfers_from_hot_wallet().await;
    assert_eq!(transfers.len(), 1, "one transfer on the canonical chain: {transfers:?}");
    assert_eq!((transfers[0].0, transfers[0].1), (made[0].1, U256::from(1000u32)));
}

/// The attempts of the transaction under `nonce`.
async fn attempts_of_nonce(env: &Env, nonce: i64) -> i64 {
    count(
        env,
        &format!(
            "SELECT count(*) FROM settlement.chain_tx_attempts a JOIN settlement.chain_txs t ON t.id = a.tx_id
             WHERE t.nonce = {nonce}"
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_waiting_behind_a_lower_nonce_at_the_market_price_is_not_replaced_and_the_lower_one_is() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 2).await;
    let chain = TestChain::unmined().await;
    let mut deliverer = deliver(&env, &chain, &chain.url(), 2, &["--replace-after-secs", "1"]);
    wait_txs(&env, "state = 'broadcast'", 2).await;
    // Nonce 0 lost by the node (a restart, a drop): nonce 1 waits for it.
    drop_newest_attempt(&env, &chain, 0).await;
    wait_until(60, "nonce 0 replaced (and so sent again)", || async {
        attempts_of_nonce(&env, 0).await >= 2
    })
    .await;
    // Several rounds of the follower past --replace-after-secs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        attempts_of_nonce(&env, 1).await,
        1,
        "nonce 1 offers the market price: waiting for nonce 0, not for fees, it is not replaced"
    );
    mine_until(
        &env,
        &chain,
        60,
        "both paid",
        "SELECT (count(*) = 2)::int::bigint FROM settlement.payouts WHERE status = 'paid'",
    )
    .await;
    common::stop(&mut deliverer);
    let mut transfers: Vec<(Address, U256)> = chain
        .transfers_from_hot_wallet()
        .await
        .into_iter()
        .map(|t| (t.0, t.1))
        .collect();
    transfers.sort();
    let mut expected: Vec<(Address, U256)> = made.iter().map(|m| (m.1, U256::from(1000u32))).collect();
    expected.sort();
    assert_eq!(transfers, expected, "each paid once");
}

/// The payouts in `status`.
async fn payouts_in(env: &Env, status: &str) -> i64 {
    count(
        env,
        &format!("SELECT count(*) FROM settlement.payouts WHERE status = '{status}'"),
    )
    .await
}

/// Long enough for the follower of heads (every 500 ms) to act many times,
/// past the grace of a spent nonce with no receipt (5 s).
const PAST_THE_GRACE: Duration = Duration::from_secs(7);

#[tokio::test(flavor = "multi_thread")]
async fn a_nonce_spent_by_a_transaction_not_settleds_is_not_replaced_and_its_payout_is_paid_once_under_a_new_nonce() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 1).await;
    let chain = TestChain::unmined().await;
    let hot: Address = HOT_WALLET.parse().unwrap();
    let before = chain.balance_of(hot).await;
    let mut deliverer = deliver(&env, &chain, &chain.url(), 2, &["--replace-after-secs", "1"]);
    wait_txs(&env, "nonce = 0 AND state = 'broadcast'", 1).await;
    // The hot wallet's key used elsewhere: settled's transfer gone from the
    // node's pool, and a transaction of the same wallet under the same
    // nonce mined instead (fees over settled's cap, so it also replaces
    // any attempt settled sends meanwhile).
    drop_newest_attempt(&env, &chain, 0).await;
    let elsewhere = rpc(
        &chain.url(),
        "eth_sendTransaction",
        json!([{"from": HOT_WALLET, "to": format!("{:#x}", Address::repeat_byte(0x42)), "value": "0x1",
                "nonce": "0x0", "gas": "0x5208",
                "maxFeePerGas": format!("{:#x}", 1_000 * GWEI), "maxPriorityFeePerGas": format!("{:#x}", 100 * GWEI)}]),
    )
    .await;
    let elsewhere = elsewhere.as_str().unwrap().to_string();
    mine(&chain).await;
    assert_eq!(chain.mined_nonce().await, 1, "nonce 0 spent by the other transaction");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attempts_spent = attempts_of_nonce(&env, 0).await;
    tokio::time::sleep(PAST_THE_GRACE).await;
    mine_until_paid(&env, &chain, 90).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    common::stop(&mut deliverer);
    assert_eq!(
        attempts_of_nonce(&env, 0).await,
        attempts_spent,
        "no attempt signed under the nonce once it was spent"
    );
    assert!(attempts_spent <= 3, "a few attempts at most: {attempts_spent}");
    let (state, mined, why): (String, String, String) =
        sqlx::query_as("SELECT state, mined_hash, given_up_why FROM settlement.chain_txs WHERE nonce = 0")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(state, "filled", "the other transaction stands for a filler");
    assert_eq!(mined, elsewhere);
    assert!(why.contains("not settled's"), "{why}");
    assert_eq!(
        env.scalar_text("SELECT state FROM settlement.chain_txs WHERE nonce = 1")
            .await,
        "confirmed",
        "paid under the next nonce"
    );
    assert_eq!(count(&env, "SELECT count(*) FROM settlement.chain_txs").await, 2);
    assert_eq!(payouts_in(&env, "failed").await, 0);
    paid_once(&env, &chain, made[0].1).await;
    assert_eq!(chain.balance_of(hot).await, before - U256::from(1000u32), "paid once");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_mined_whose_receipt_the_node_never_gives_is_found_in_its_block_and_paid_on_its_transfer_logs() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 1).await;
    let chain = TestChain::unmined().await;
    let proxy = RpcProxy::start(chain.url()).await;
    proxy.hide(hide::RECEIPTS);
    let mut deliverer = deliver(&env, &chain, &proxy.url, 2, &["--replace-after-secs", "1"]);
    wait_txs(&env, "state = 'broadcast'", 1).await;
    mine(&chain).await;
    assert_eq!(chain.mined_nonce().await, 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attempts_spent = attempts_of_nonce(&env, 0).await;
    mine_until_paid(&env, &chain, 90).await;
    common::stop(&mut deliverer);
    let (attempts, mined) = attempts_and_mined(&env).await;
    assert_eq!(
        attempts.len() as i64,
        attempts_spent,
        "not replaced once spent: {attempts:?}"
    );
    assert!(
        attempts.contains(&mined.clone().unwrap()),
        "one of its attempts: {mined:?}"
    );
    assert_eq!(
        env.scalar_text("SELECT state FROM settlement.chain_txs").await,
        "confirmed"
    );
    assert_eq!(
        count(&env, "SELECT count(*) FROM settlement.chain_txs").await,
        1,
        "nothing signed again"
    );
    paid_once(&env, &chain, made[0].1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spent_nonce_the_node_has_no_history_of_waits_for_an_operator_and_its_payout_stays_sent() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 1).await;
    let chain = TestChain::unmined().await;
    let proxy = RpcProxy::start(chain.url()).await;
    proxy.hide(hide::RECEIPTS | hide::BLOCK_TRANSACTIONS);
    let mut deliverer = deliver(&env, &chain, &proxy.url, 2, &["--replace-after-secs", "1"]);
    wait_txs(&env, "state = 'broadcast'", 1).await;
    mine(&chain).await;
    for _ in 0..3 {
        mine(&chain).await;
    }
    wait_txs(&env, "awaiting_operator_at IS NOT NULL", 1).await;
    let why = env
        .scalar_text("SELECT awaiting_operator_why FROM settlement.chain_txs")
        .await;
    assert!(why.contains("nonce 0") && why.contains("no receipt"), "{why}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(payouts_in(&env, "sent").await, 1, "neither paid nor failed");
    assert_eq!(
        env.scalar_text("SELECT state FROM settlement.chain_txs").await,
        "broadcast"
    );
    assert_eq!(attempts_of_nonce(&env, 0).await, 1, "never replaced");
    let token = format!("{:#x}", chain.token);
    let out = env.run(&["reconcile", "--chain-rpc-url", &proxy.url, "--token-address", &token]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("payout {}: sent, neither paid nor failed", made[0].0))
            && text.contains("waits for an operator"),
        "{text}"
    );
    // The node's receipts back: the receipt moves it as usual.
    proxy.hide(0);
    mine_until_paid(&env, &chain, 60).await;
    common::stop(&mut deliverer);
    paid_once(&env, &chain, made[0].1).await;
}
