//! The chain model's counterexamples, replayed against a real node (anvil,
//! mining only when the test says) and the real chain rail
//! (`settled::chain`: `ChainRail::send`, write-ahead `sign_ahead`, the
//! follower's `confirm::round`, `give_up`). Each test first asks the model
//! for its counterexample and checks that the trace takes the replay's key
//! steps, in order; then it plays those steps twice: with the guard left
//! out (a hand-written signing, a hand-written lookup of the latest hash
//! only, a confirmation depth of one, a requeue at once), the model's bad
//! state appears on the chain; with the real code it does not. The chain
//! is read by the test's own JSON-RPC calls.
//!
//! The traces are `settled-models --counterexamples`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::{SolEvent, SolValue};
use serde_json::{json, Value};
use settled::chain::abi::IERC20;
use settled::chain::{confirm, give_up, sign, Chain, ChainFlags, ChainRail};
use settled::payouts::{apply_word, word::ProviderWord, PayoutRow, Rail, Source};
use settled_models::suite::{self, Counterexample};
use sqlx::PgPool;

const CREATOR: &str = "0x00000000000000000000000000000000000000c1";
const BALANCE: i64 = 1_000;
const AMOUNT: i64 = 100;
/// anvil's well-known development accounts (public test data): the first
/// deploys the token, the second is the hot wallet.
const DEPLOYER: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";
const HOT_WALLET: &str = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";
const HOT_WALLET_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
const SUPPLY: u128 = 1_000_000_000_000_000_000;

// ---- the model's side -------------------------------------------------

/// The model's counterexample, printed; it must take `steps` (each a part
/// of one of its actions' lines), in this order.
fn model_takes(found: Counterexample, steps: &[&str]) {
    let trace = common::printed_trace(found);
    let mut lines = trace.lines();
    for step in steps {
        assert!(
            lines.any(|l| l.contains(step)),
            "the model's trace does not take {step:?} in order:\n{trace}"
        );
    }
}

// ---- the node, the token, the payout ------------------------------------

async fn rpc(url: &str, method: &str, params: Value) -> Value {
    let answer: Value = reqwest::Client::new()
        .post(url)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(answer.get("error").is_none(), "{method} refused: {answer}");
    answer["result"].clone()
}

async fn mine(url: &str) {
    rpc(url, "evm_mine", json!([])).await;
}

/// A test's world: the database with one queued payout, anvil with the
/// token, the chain as the rail sees it.
struct World {
    _db: settled_testkit::TestDb,
    pool: PgPool,
    anvil: settled_testkit::Anvil,
    chain: Arc<Chain>,
    payout: PayoutRow,
    _key: tempfile::NamedTempFile,
}

impl World {
    async fn new(confirmations: u64) -> World {
        let db = settled_testkit::TestDb::create().await.unwrap();
        let pool = common::pool(&db.url).await;
        settled::db::migrate(&pool).await.unwrap();
        let anvil = settled_testkit::Anvil::start(&["--no-mining"]);
        let token = deploy_token(&anvil.url()).await;
        let key = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(key.path(), HOT_WALLET_KEY).unwrap();
        std::fs::set_permissions(key.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        let flags = ChainFlags {
            chain_rpc_url: Some(anvil.url()),
            token_address: Some(token),
            signer_key_file: Some(key.path().to_path_buf()),
            confirmations,
            fee_cap_gwei: settled::chain::DEFAULT_FEE_CAP_GWEI,
            replace_after_secs: 3600,
            batch_contract: None,
            batch_max: settled::chain::DEFAULT_BATCH_MAX,
            watch_every_secs: settled::chain::DEFAULT_WATCH_EVERY_SECS,
            reconcile_every_secs: 0,
        };
        let chain = Arc::new(Chain::connect(&pool, &flags).await.unwrap().unwrap());
        let payout = queued_payout(&pool).await;
        World {
            _db: db,
            pool,
            anvil,
            chain,
            payout,
            _key: key,
        }
    }

    fn url(&self) -> String {
        self.anvil.url()
    }

    fn rail(&self) -> ChainRail {
        ChainRail::new(self.chain.clone(), self.pool.clone())
    }

    /// Delivery's call: the rail sends, the payout moves by its answer.
    async fn deliver(&self) {
        let payment = self.rail().send(&self.payout, None).await.unwrap();
        let mut conn = self.pool.acquire().await.unwrap();
        let word = ProviderWord::Pending {
            provider_id: payment.id,
        };
        apply_word(&mut conn, self.payout.id, &word, Source::Delivery, None)
            .await
            .unwrap();
    }

    /// Mines a block, then lets the follower of heads look, `blocks` times.
    async fn mine_and_follow(&self, blocks: usize) {
        for _ in 0..blocks {
            mine(&self.url()).await;
            confirm::round(&self.pool, &self.chain).await.unwrap();
        }
    }

    async fn status(&self) -> String {
        sqlx::query_scalar("SELECT status FROM settlement.payouts WHERE id = $1")
            .bind(self.payout.id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The token's `Transfer`s from the hot wallet on the canonical chain.
    async fn transfers(&self) -> Vec<(Address, U256)> {
        let from = B256::left_padding_from(HOT_WALLET.parse::<Address>().unwrap().as_slice());
        settled_testkit::chain::logs(&self.url(), self.chain.token, &[IERC20::Transfer::SIGNATURE_HASH, from])
            .await
            .into_iter()
            .map(|log| {
                let t = IERC20::Transfer::decode_raw_log(log.topics, &log.data).unwrap();
                (t.to, t.value)
            })
            .collect()
    }

    /// Signs, by hand, a transfer paying the payout under `nonce` (what a
    /// path without the guard does) and sends it.
    async fn hand_signed_transfer(&self, nonce: i64) {
        let fees = self.chain.fees().await.unwrap();
        let mut db = self.pool.begin().await.unwrap();
        sqlx::query("UPDATE settlement.chain_tx_payouts SET given_up = true")
            .execute(&mut *db)
            .await
            .unwrap();
        let tx = sign::sign_in(
            &mut db,
            &self.chain,
            nonce,
            std::slice::from_ref(&self.payout),
            fees,
            &["queued", "sent"],
        )
        .await
        .unwrap();
        let raw: Vec<u8> = sqlx::query_scalar("SELECT raw FROM settlement.chain_tx_attempts WHERE tx_id = $1")
            .bind(tx.expect("signed"))
            .fetch_one(&mut *db)
            .await
            .unwrap();
        // Never stored: the hand-written path keeps it in memory only.
        db.rollback().await.unwrap();
        rpc(
            &self.url(),
            "eth_sendRawTransaction",
            json!([format!("0x{}", alloy_primitives::hex::encode(raw))]),
        )
        .await;
    }

    async fn one_transfer_to_the_creator(&self) {
        let creator: Address = CREATOR.parse().unwrap();
        assert_eq!(
            self.transfers().await,
            vec![(creator, U256::from(AMOUNT as u64))],
            "paid once, on the chain"
        );
    }
}

async fn deploy_token(url: &str) -> Address {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts/build/TestToken.bin");
    let mut code = alloy_primitives::hex::decode(std::fs::read_to_string(path).unwrap().trim()).unwrap();
    let holder: Address = HOT_WALLET.parse().unwrap();
    code.extend((holder, U256::from(SUPPLY), Address::repeat_byte(0xee)).abi_encode_params());
    let data = format!("0x{}", alloy_primitives::hex::encode(code));
    let hash = rpc(
        url,
        "eth_sendTransaction",
        json!([{"from": DEPLOYER, "data": data, "gas": "0x2dc6c0"}]),
    )
    .await;
    mine(url).await;
    let receipt = rpc(url, "eth_getTransactionReceipt", json!([hash])).await;
    receipt["contractAddress"].as_str().unwrap().parse().unwrap()
}

/// One payout of [`AMOUNT`] to [`CREATOR`], queued: made and confirmed
/// through the API's own functions.
async fn queued_payout(pool: &PgPool) -> PayoutRow {
    sqlx::query("INSERT INTO settlement.creator_balance (creator, balance) VALUES ($1, $2)")
        .bind(CREATOR)
        .bind(BALANCE)
        .execute(pool)
        .await
        .unwrap();
    let id = post_queued_payout(pool).await;
    let mut conn = pool.acquire().await.unwrap();
    settled::payouts::row::load(&mut conn, id).await.unwrap().unwrap()
}

async fn chain_txs(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM settlement.chain_txs")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn attempt_raw(pool: &PgPool, filler: bool) -> (String, String) {
    let (hash, raw): (String, Vec<u8>) = sqlx::query_as(
        "SELECT hash, raw FROM settlement.chain_tx_attempts WHERE filler = $1 ORDER BY tx_id, attempt LIMIT 1",
    )
    .bind(filler)
    .fetch_one(pool)
    .await
    .unwrap();
    (hash, format!("0x{}", alloy_primitives::hex::encode(raw)))
}

/// `POST /v1/payouts` (no confirmation asked: queued at once) to a `settled serve` of `pool`'s
/// database on a loopback port: the payout's id.
async fn post_queued_payout(pool: &PgPool) -> i64 {
    const API_TOKEN: &str = "replay-token";
    let mut state = settled::api::AppState::new(pool.clone(), pool.clone());
    state.api_token = Some(Arc::from(API_TOKEN));
    let limits = state.limits;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = settled::api::router(state);
    tokio::spawn(settled::api::server::run(listener, app, limits, std::future::pending()));
    let body = json!({ "creator": CREATOR, "amount": AMOUNT.to_string() });
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/payouts"))
        .bearer_auth(API_TOKEN)
        .header("Idempotency-Key", "replay-chain")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let created: Value = response.json().await.unwrap();
    assert_eq!(created["status"], "queued", "{created}");
    created["id"].as_i64().unwrap()
}

/// The chain as seen by the node: the hot wallet's mined transactions.
async fn mined_nonce(url: &str) -> u64 {
    let n = rpc(url, "eth_getTransactionCount", json!([HOT_WALLET, "latest"])).await;
    u64::from_str_radix(n.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

// ---- the replays ---------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn without_write_ahead_a_deliverer_killed_after_its_broadcast_signs_again_and_pays_twice() {
    model_takes(
        suite::without_write_ahead(),
        &[
            "sign a transfer for payout 0",
            "send attempt 0",
            "SIGKILL",
            "sign a transfer for payout 0",
        ],
    );
    // Without: the transfer is signed and sent, the deliverer killed
    // before it stores anything; restarted, it signs again, nonce 1.
    let w = World::new(2).await;
    w.hand_signed_transfer(0).await;
    w.hand_signed_transfer(1).await;
    mine(&w.url()).await;
    assert_eq!(w.transfers().await.len(), 2, "without write-ahead signing: paid twice");

    // The real code: signed and stored ahead, sent, killed before it
    // recorded the broadcast; the restarted deliverer sends the same bytes.
    let w = World::new(2).await;
    let fees = w.chain.fees().await.unwrap();
    sign::sign_ahead(&w.pool, &w.chain, &w.payout, fees)
        .await
        .unwrap()
        .expect("signed");
    let (_, original) = attempt_raw(&w.pool, false).await;
    rpc(&w.url(), "eth_sendRawTransaction", json!([original])).await;
    w.deliver().await;
    w.mine_and_follow(3).await;
    assert_eq!(w.status().await, "paid");
    assert_eq!(chain_txs(&w.pool).await, 1, "one transaction, one nonce");
    w.one_transfer_to_the_creator().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tracking_only_the_latest_attempt_misreads_a_mined_original_and_pays_twice() {
    model_takes(
        suite::without_every_attempt(),
        &[
            "replacement under its nonce",
            "NODE mines attempt 0",
            "nonce taken by an attempt it does not know",
            "sign a transfer for payout 0",
        ],
    );
    for guarded in [false, true] {
        let w = World::new(2).await;
        w.deliver().await;
        // Stuck: a replacement signed, stored and sent (it takes the
        // original's place in this node's pool).
        let mut eager = (*w.chain).clone();
        eager.replace_after = Duration::ZERO;
        assert_eq!(confirm::round(&w.pool, &eager).await.unwrap().replaced, 1);
        let latest: String =
            sqlx::query_scalar("SELECT hash FROM settlement.chain_tx_attempts ORDER BY attempt DESC LIMIT 1")
                .fetch_one(&w.pool)
                .await
                .unwrap();
        // The replacement is lost; the original, held elsewhere, is mined.
        rpc(&w.url(), "anvil_dropTransaction", json!([latest])).await;
        let (_, original) = attempt_raw(&w.pool, false).await;
        rpc(&w.url(), "eth_sendRawTransaction", json!([original])).await;
        if guarded {
            w.mine_and_follow(3).await;
            assert_eq!(w.status().await, "paid");
            let mined: String = sqlx::query_scalar("SELECT mined_hash FROM settlement.chain_txs")
                .fetch_one(&w.pool)
                .await
                .unwrap();
            assert_eq!(mined, attempt_raw(&w.pool, false).await.0, "the mined original counts");
            assert_eq!(chain_txs(&w.pool).await, 1);
            w.one_transfer_to_the_creator().await;
        } else {
            mine(&w.url()).await;
            let receipt = rpc(&w.url(), "eth_getTransactionReceipt", json!([latest])).await;
            assert!(
                receipt.is_null() && mined_nonce(&w.url()).await == 1,
                "latest hash unmined, nonce spent"
            );
            // Read as "nonce taken by another": the payout signed again.
            w.hand_signed_transfer(1).await;
            mine(&w.url()).await;
            assert_eq!(w.transfers().await.len(), 2, "only the latest hash: paid twice");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn paid_at_inclusion_a_reorg_leaves_a_paid_payout_unpaid_and_at_depth_it_is_not() {
    model_takes(suite::without_depth(), &["found in a block", "at the depth", "REORG"]);
    // Without: a depth of one, paid at inclusion; one block reorganised away.
    let w = World::new(1).await;
    w.deliver().await;
    w.mine_and_follow(1).await;
    confirm::round(&w.pool, &w.chain).await.unwrap();
    assert_eq!(w.status().await, "paid", "paid at inclusion");
    rpc(&w.url(), "anvil_reorg", json!([1, []])).await;
    assert!(
        w.transfers().await.is_empty(),
        "paid at inclusion: a paid payout with no transfer"
    );

    // The real depth (2 here): the reorg seen, sent again, paid once at depth.
    let w = World::new(2).await;
    w.deliver().await;
    w.mine_and_follow(1).await;
    assert_eq!(w.status().await, "sent", "included, short of the depth");
    rpc(&w.url(), "anvil_reorg", json!([1, []])).await;
    assert_eq!(confirm::round(&w.pool, &w.chain).await.unwrap().reorged, 1);
    assert_ne!(w.status().await, "paid");
    w.mine_and_follow(3).await;
    assert_eq!(w.status().await, "paid");
    w.one_transfer_to_the_creator().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn requeued_before_its_filler_is_confirmed_a_payout_is_paid_twice_and_after_it_is_not() {
    model_takes(
        suite::without_filler_confirmed(),
        &[
            "nonce given up",
            "sign a transfer for payout 0",
            "NODE mines attempt 0",
            "NODE mines attempt 2",
        ],
    );
    for guarded in [false, true] {
        let w = World::new(2).await;
        w.deliver().await;
        assert!(give_up::give_up_nonce(&w.pool, &w.chain, 0, "replayed").await.unwrap());
        if !guarded {
            // Requeued at once: given up by its transaction, signed again.
            sqlx::query("UPDATE settlement.chain_tx_payouts SET given_up = true")
                .execute(&w.pool)
                .await
                .unwrap();
        }
        // The filler is lost; the original, held elsewhere, is mined.
        rpc(
            &w.url(),
            "anvil_dropTransaction",
            json!([attempt_raw(&w.pool, true).await.0]),
        )
        .await;
        rpc(
            &w.url(),
            "eth_sendRawTransaction",
            json!([attempt_raw(&w.pool, false).await.1]),
        )
        .await;
        if !guarded {
            // Its new transfer, under nonce 1 (sent after the pool settled:
            // a node drops what waits on a dropped nonce).
            w.hand_signed_transfer(1).await;
        }
        if guarded {
            w.mine_and_follow(3).await;
            assert_eq!(w.status().await, "paid");
            assert_eq!(chain_txs(&w.pool).await, 1, "nothing signed again");
            w.one_transfer_to_the_creator().await;
        } else {
            mine(&w.url()).await;
            mine(&w.url()).await;
            assert_eq!(
                w.transfers().await.len(),
                2,
                "requeued before the filler's confirmation: paid twice"
            );
        }
    }
}
