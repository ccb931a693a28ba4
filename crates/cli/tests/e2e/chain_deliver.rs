//! The chain rail against a real node (anvil) with real processes: several
//! `settled deliver` processes pay payouts as ERC-20 transfers from one hot
//! wallet, while some are SIGKILLed after signing and before their
//! broadcast left, and after it left but before they recorded it. The
//! chain's own `Transfer` logs, read by the test, say each payout was paid
//! exactly once, and the refused recipient's payout failed with its funds
//! returned.

use crate::chain_support;
use crate::common;

use alloy_primitives::{Address, U256};
use alloy_sol_types::SolCall;
use chain_support::{
    balance, count, deliver, kill9, payouts, queued_payouts, wait_paid_or_failed, Broadcasts, Deliverer, RpcProxy,
    TestChain, HOT_WALLET, SUPPLY,
};
use common::{wait_until, Env};
use serde_json::json;

/// True when the node knows transaction `hash` (pooled or mined).
async fn node_knows(chain: &TestChain, hash: &str) -> bool {
    !chain_support::rpc(&chain.url(), "eth_getTransactionByHash", json!([hash]))
        .await
        .is_null()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_payout_is_paid_once_on_chain_though_deliverers_die_between_signing_and_broadcasting() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 24).await;
    let refused = made[0].1;
    let chain = TestChain::start(&["--block-time", "1"], "TestToken", refused).await;
    let proxy = RpcProxy::start(chain.url()).await;

    // 1. Broadcasts never leave: the deliverer signs and stores, then is killed.
    proxy.set(Broadcasts::Swallow);
    let mut first = deliver(&env, &chain, &proxy.url, 2, &[]);
    wait_until(60, "transactions signed ahead", || async {
        count(&env, "SELECT count(*) FROM settlement.chain_txs").await >= 3
    })
    .await;
    kill9(&mut first);
    let signed: Vec<String> = sqlx::query_scalar(
        "SELECT a.hash FROM settlement.chain_txs t JOIN settlement.chain_tx_attempts a ON a.tx_id = t.id
         WHERE t.state = 'signed'",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(signed.len() >= 3, "killed between signing and broadcasting: {signed:?}");
    for hash in &signed {
        assert!(!node_knows(&chain, hash).await, "{hash} never reached the node");
    }

    // 2. Broadcasts leave, their answers never come back: killed before recording.
    proxy.set(Broadcasts::ForwardUnanswered);
    let before = count(&env, "SELECT count(*) FROM settlement.chain_txs").await;
    let mut second = deliver(&env, &chain, &proxy.url, 2, &[]);
    wait_until(60, "more transactions signed and sent", || async {
        count(&env, "SELECT count(*) FROM settlement.chain_txs").await >= before + 3
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    kill9(&mut second);
    let forwarded: Vec<String> = sqlx::query_scalar(
        "SELECT a.hash FROM settlement.chain_txs t JOIN settlement.chain_tx_attempts a ON a.tx_id = t.id
         WHERE t.state = 'signed' AND t.id > $1",
    )
    .bind(before)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut on_node = 0;
    for hash in &forwarded {
        on_node += usize::from(node_knows(&chain, hash).await);
    }
    assert!(
        on_node >= 1,
        "a broadcast reached the node and was never recorded: {forwarded:?}"
    );

    // 3. Three deliverers straight to the node, one killed while they confirm.
    proxy.set(Broadcasts::Pass);
    let mut fleet: Vec<Deliverer> = (0..3).map(|_| deliver(&env, &chain, &chain.url(), 2, &[])).collect();
    wait_until(60, "a payout paid", || async {
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'paid'").await >= 1
    })
    .await;
    kill9(&mut fleet[0]);
    wait_paid_or_failed(&env).await;
    for child in fleet.iter_mut().skip(1) {
        common::stop(child);
    }

    // From the chain alone: each paid payout's creator received its amount
    // once, failed ones nothing with their funds back, one nonce each.
    let found = chain_support::check_from_chain(&env, &chain, &made).await;
    let refused_payout = made[0].0;
    assert_eq!(
        payouts(&env.pool).await[&refused_payout].2,
        "failed",
        "the refused recipient's transfer reverted"
    );
    assert_eq!(found.failed, 1);
    env.run_ok(&["verify", "--payouts"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_pays_many_in_one_transaction_and_a_refused_recipient_fails_alone_after_splits() {
    let env = Env::new().await;
    let made = queued_payouts(&env, 10).await;
    let refused = made[3].1;
    let chain = TestChain::start(&["--block-time", "1"], "TestToken", refused).await;
    let pay_many = chain_support::deploy(&chain.url(), "PayMany", Vec::new()).await;
    let batch = format!("{pay_many:#x}");
    let mut deliverer = deliver(
        &env,
        &chain,
        &chain.url(),
        1,
        &["--batch-contract", &batch, "--batch-max", "8"],
    );
    wait_paid_or_failed(&env).await;
    common::stop(&mut deliverer);

    let stored = payouts(&env.pool).await;
    let failed: Vec<i64> = stored
        .iter()
        .filter(|(_, p)| p.2 == "failed")
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(failed, vec![made[3].0], "only the refused recipient's payout failed");
    let transfers = chain.transfers_from_hot_wallet().await;
    assert_eq!(transfers.len(), 9, "nine transfers: {transfers:?}");
    for (id, (creator, amount, state)) in &stored {
        let got: Vec<U256> = transfers.iter().filter(|t| t.0 == *creator).map(|t| t.1).collect();
        match state.as_str() {
            "paid" => assert_eq!(got, vec![*amount], "payout {id} paid once"),
            _ => assert!(got.is_empty(), "payout {id} received nothing"),
        }
    }
    let biggest: i64 = count(
        &env,
        "SELECT max(n) FROM (SELECT count(*) AS n FROM settlement.chain_tx_payouts GROUP BY tx_id) b",
    )
    .await;
    assert!(biggest > 1, "payouts went out in batches");
    assert!(
        count(&env, "SELECT count(*) FROM settlement.chain_tx_payouts WHERE given_up").await > 1,
        "the reverted batch was split"
    );
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM settlement.chain_txs WHERE purpose = 'approve' AND state = 'confirmed'"
        )
        .await,
        1,
        "the batch contract approved once"
    );
    for (id, creator, before) in &made {
        let now = balance(&env, &format!("{creator:#x}")).await;
        match stored[id].2.as_str() {
            "failed" => assert_eq!(now, *before, "failed payout {id}: its funds are back, once"),
            _ => assert_eq!(now, *before - U256::from(1000u32), "paid payout {id}: debited once"),
        }
    }
    let hot: Address = HOT_WALLET.parse().unwrap();
    assert_eq!(chain.balance_of(hot).await, U256::from(SUPPLY) - U256::from(9000u32));
    env.run_ok(&["verify", "--payouts"]);

    // The wallet as operators see it: its address, not its key; nothing in flight.
    let key = chain.key_file.path().display().to_string();
    let wallet = env.run_ok(&[
        "wallet",
        "--chain-rpc-url",
        &chain.url(),
        "--token-address",
        &format!("{:#x}", chain.token),
        "--signer-key-file",
        &key,
    ]);
    assert!(
        wallet.contains(&format!("wallet {HOT_WALLET} on chain 31337")),
        "{wallet}"
    );
    assert!(wallet.contains("in flight: 0"), "{wallet}");
    assert!(
        wallet.contains(&format!(
            "token {:#x}: {}",
            chain.token,
            U256::from(SUPPLY) - U256::from(9000u32)
        )),
        "{wallet}"
    );
    let nonces = count(&env, "SELECT next_nonce FROM settlement.chain_senders").await;
    assert!(
        wallet.contains(&format!(
            "next nonce: database {nonces}, node {nonces} mined, {nonces} pending"
        )),
        "{wallet}"
    );
    assert!(!wallet.contains(&chain_support::HOT_WALLET_KEY[2..]), "never the key");

    // Reconcile agrees with the chain; then a transfer from the hot wallet
    // outside settled, to a paid creator, of its amount: reconcile names it.
    let token = format!("{:#x}", chain.token);
    let reconcile = ["reconcile", "--chain-rpc-url", &chain.url(), "--token-address", &token];
    let clean = env.run(&reconcile);
    assert!(clean.status.success(), "{}", String::from_utf8_lossy(&clean.stdout));
    let (paid_id, paid_creator, _) = made[0];
    let data = settled::chain::abi::IERC20::transferCall {
        to: paid_creator,
        value: U256::from(1000u32),
    }
    .abi_encode();
    let hash = chain_support::rpc(
        &chain.url(),
        "eth_sendTransaction",
        json!([{"from": HOT_WALLET, "to": chain.token, "data": alloy_primitives::Bytes::from(data)}]),
    )
    .await;
    chain_support::receipt(&chain.url(), hash.as_str().unwrap()).await;
    let out = env.run(&reconcile);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("payout {paid_id}: paid twice?")), "{text}");
}
