//! What operators see of the chain rail, against a real node (anvil) that
//! mines only when the test says: one payout whose transfer is stuck under
//! a base fee that jumped and is replaced, is included, is taken out by a
//! reorg and included again, and is paid at the confirmation depth. Then
//! `settled serve`'s metrics (`settled_chain_*`), the `/chain` page and the
//! payout's link to it, and `settled verify --payouts --chain-rpc-url`:
//! clean, and after a transfer sent from the hot wallet outside settled,
//! naming the payout (and the deliverer's own reconciliation counts it).

use crate::chain_support;
use crate::common;

use alloy_primitives::U256;
use alloy_sol_types::SolCall;
use chain_support::{
    count, deliver, mine, mine_until_paid, queued_payouts, rpc, wait_count, Deliverer, TestChain, HOT_WALLET,
};
use common::{wait_until, Env, Server};
use serde_json::json;

const TOKEN: &str = common::BROWSER_TOKEN;
const GWEI: u64 = 1_000_000_000;

async fn get(server: &Server, path: &str) -> String {
    let r = common::client_with(TOKEN)
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.text().await.unwrap()
}

/// The value of metric `name` for the hot wallet, as text; None when absent.
async fn metric(server: &Server, name: &str) -> Option<String> {
    let text = get(server, "/metrics").await;
    let prefix = format!("{name}{{chain_id=\"31337\",sender=\"{HOT_WALLET}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map(str::to_string)
}

/// One payout stuck, replaced, included, reorged out, included again and
/// paid; the deliverer still running (its watch records every second).
async fn paid_through_a_replacement_and_a_reorg(env: &Env, chain: &TestChain, server: &Server) -> Deliverer {
    let flags = [
        "--replace-after-secs",
        "1",
        "--watch-every-secs",
        "1",
        "--reconcile-every-secs",
        "1",
    ];
    let deliverer = deliver(env, chain, &chain.url(), 4, &flags);
    let broadcast = "SELECT count(*) FROM settlement.chain_txs WHERE state = 'broadcast'";
    wait_count(env, "the transfer broadcast", broadcast, 1).await;
    rpc(
        &chain.url(),
        "anvil_setNextBlockBaseFeePerGas",
        json!([format!("{:#x}", 100 * GWEI)]),
    )
    .await;
    mine(chain).await;
    wait_count(
        env,
        "a replacement signed",
        "SELECT count(*) FROM settlement.chain_tx_attempts",
        2,
    )
    .await;
    assert_eq!(
        metric(server, "settled_chain_in_flight_transactions").await.as_deref(),
        Some("1")
    );
    let oldest: f64 = metric(server, "settled_chain_oldest_in_flight_seconds")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(oldest > 0.0, "the stuck nonce's age: {oldest}");
    // One block with the replacement in it, one on top: the reorg takes both.
    let replacement = env
        .scalar_text("SELECT hash FROM settlement.chain_tx_attempts WHERE attempt = 2")
        .await;
    wait_until(60, "the replacement in the node's pool", || async {
        !rpc(&chain.url(), "eth_getTransactionByHash", json!([replacement]))
            .await
            .is_null()
    })
    .await;
    mine(chain).await;
    let included = "SELECT count(*) FROM settlement.chain_txs WHERE state = 'included'";
    wait_count(env, "the replacement included", included, 1).await;
    mine(chain).await;
    rpc(&chain.url(), "anvil_reorg", json!([2, []])).await;
    let reorged =
        "SELECT count(*) FROM settlement.chain_tx_history WHERE from_state = 'included' AND to_state = 'broadcast'";
    wait_count(env, "the reorg seen", reorged, 1).await;
    mine_until_paid(env, chain, 60).await;
    deliverer
}

/// The `/chain` page as headless Chromium renders it (when installed; CI
/// installs it), and a screenshot.
fn in_a_browser(server: &Server, tx_id: i64, mined: &str) {
    let Some(browser) = common::chromium() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have chromium (.ci/run installs it)"
        );
        eprintln!("skipped the browser: no chromium here (apt-get install chromium)");
        return;
    };
    let profile = tempfile::tempdir().unwrap();
    let url = format!("{}/chain", server.base);
    let dom = common::browse(&browser, profile.path(), &["--dump-dom"], &url);
    assert!(dom.contains(&format!("id=\"tx-{tx_id}\"")), "{dom}");
    assert!(
        dom.contains(&format!("data-hash=\"{mined}\" data-mined=\"true\"")),
        "{dom}"
    );
    let shots = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("dashboard-chain.png");
    common::browse(
        &browser,
        profile.path(),
        &[&format!("--screenshot={}", shot.display())],
        &url,
    );
    assert!(shot.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_the_chain_page_and_verify_follow_a_replacement_a_reorg_and_a_transfer_outside_settled() {
    let env = Env::new().await;
    let (payout, creator, _) = queued_payouts(&env, 1).await[0];
    let chain = TestChain::unmined().await;
    let server = env.serve(TOKEN).await;
    let mut deliverer = paid_through_a_replacement_and_a_reorg(&env, &chain, &server).await;

    // The metrics: nothing in flight, one reorg, the gas balance as the
    // node has it, a clean reconciliation.
    wait_until(30, "the wallet watched and reconciled after the payment", || async {
        metric(&server, "settled_chain_reconcile_age_seconds")
            .await
            .is_some_and(|age| age.parse::<f64>().unwrap() < 1.0)
    })
    .await;
    assert_eq!(
        metric(&server, "settled_chain_in_flight_transactions").await.as_deref(),
        Some("0")
    );
    assert_eq!(
        metric(&server, "settled_chain_oldest_in_flight_seconds")
            .await
            .as_deref(),
        Some("0.000")
    );
    assert_eq!(
        metric(&server, "settled_chain_reorgs_total").await.as_deref(),
        Some("1")
    );
    assert_eq!(
        metric(&server, "settled_chain_reconcile_mismatches").await.as_deref(),
        Some("0")
    );
    let gas = rpc(&chain.url(), "eth_getBalance", json!([HOT_WALLET, "latest"])).await;
    let gas = U256::from_str_radix(gas.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    assert_eq!(
        metric(&server, "settled_chain_gas_balance_wei").await,
        Some(gas.to_string())
    );

    // The page: the transaction, both attempts' hashes, the mined one, its
    // block, the reorg, the payout; and the payout's link to it.
    let tx_id = count(&env, "SELECT id FROM settlement.chain_txs").await;
    let attempts: Vec<String> = sqlx::query_scalar("SELECT hash FROM settlement.chain_tx_attempts ORDER BY attempt")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    let mined = env.scalar_text("SELECT mined_hash FROM settlement.chain_txs").await;
    let page = get(&server, "/chain").await;
    let row = &page[page
        .find(&format!("data-tx=\"{tx_id}\""))
        .expect("the transaction listed")..];
    assert!(row.contains("data-state=\"confirmed\""), "{page}");
    for hash in &attempts {
        assert!(row.contains(&format!("data-hash=\"{hash}\"")), "attempt {hash}: {page}");
    }
    assert!(
        row.contains(&format!("data-hash=\"{mined}\" data-mined=\"true\"")),
        "{page}"
    );
    assert!(row.contains("data-reorgs=\"1\""), "{page}");
    assert!(row.contains(&format!("href=\"/payouts/{payout}\"")), "{page}");
    let payout_page = get(&server, &format!("/payouts/{payout}")).await;
    assert!(
        payout_page.contains(&format!("href=\"/chain?tx={tx_id}#tx-{tx_id}\"")),
        "{payout_page}"
    );
    assert!(get(&server, &format!("/chain?tx={tx_id}"))
        .await
        .contains(&format!("id=\"tx-{tx_id}\"")));
    in_a_browser(&server, tx_id, &mined);

    // verify with the chain: clean; then a transfer from the hot wallet
    // outside settled, to the paid creator, of its amount.
    let token = format!("{:#x}", chain.token);
    let verify = [
        "verify",
        "--payouts",
        "--chain-rpc-url",
        &chain.url(),
        "--token-address",
        &token,
    ];
    let clean = env.run_ok(&verify);
    assert!(clean.contains("[ok] chain_transfers_match_payouts"), "{clean}");
    let data = settled::chain::abi::IERC20::transferCall {
        to: creator,
        value: U256::from(1000u32),
    }
    .abi_encode();
    let hash = rpc(
        &chain.url(),
        "eth_sendTransaction",
        json!([{"from": HOT_WALLET, "to": chain.token, "data": alloy_primitives::Bytes::from(data)}]),
    )
    .await;
    mine(&chain).await;
    chain_support::receipt(&chain.url(), hash.as_str().unwrap()).await;
    let out = env.run(&verify);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("[FAIL] chain_transfers_match_payouts"), "{text}");
    assert!(text.contains(&format!("payout {payout}: paid twice?")), "{text}");
    wait_until(30, "the deliverer's reconciliation counts the mismatch", || async {
        metric(&server, "settled_chain_reconcile_mismatches").await.as_deref() == Some("1")
    })
    .await;
    common::stop(&mut deliverer);
}

/// A reconciliation reads the wallet's whole history: sixteen deliverers
/// racing for the fleet's turn (sixteen connections at once) get one turn
/// between them, none while the period runs, and one again after it.
#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_takes_one_reconciliation_turn_per_period_on_the_database_clock() {
    use settled::chain::watch::take_reconcile_turn;
    use std::time::Duration;
    let env = Env::new().await;
    let sender: alloy_primitives::Address = HOT_WALLET.parse().unwrap();
    let lower = HOT_WALLET.to_lowercase();
    sqlx::query("INSERT INTO settlement.chain_senders (chain_id, sender, next_nonce) VALUES (31337, $1, 0)")
        .bind(&lower) // $1
        .execute(&env.pool)
        .await
        .unwrap();
    let period = Duration::from_millis(1500);
    let race = || async {
        let racers = (0..16).map(|_| {
            let pool = env.pool.clone();
            tokio::spawn(async move { take_reconcile_turn(&pool, 31337, sender, period).await.unwrap() })
        });
        let mut won = 0;
        for racer in racers.collect::<Vec<_>>() {
            won += usize::from(racer.await.unwrap());
        }
        won
    };
    assert_eq!(race().await, 0, "no wallet row (no gas recorded yet): no turn");
    sqlx::query("INSERT INTO settlement.chain_wallet_watch (chain_id, sender, gas_balance) VALUES (31337, $1, 0)")
        .bind(&lower) // $1
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(race().await, 1, "the first turn: one of sixteen");
    assert_eq!(race().await, 0, "within the period: none");
    tokio::time::sleep(period).await;
    assert_eq!(race().await, 1, "after the period: one again");
}
