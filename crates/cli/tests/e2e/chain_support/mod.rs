//! What the chain rail's tests share: a real anvil with the test token
//! deployed and the hot wallet funded, JSON-RPC calls of the test's own
//! (the chain is read by the test, not through the code under test), a
//! proxy in front of the node that can swallow broadcasts, and the check
//! from the chain's `Transfer` logs that each payout was paid once.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::{SolCall, SolEvent, SolValue};
use serde_json::{json, Value};
use settled::chain::abi::IERC20;
use settled_testkit::Anvil;
use std::process::{Child, Stdio};

use crate::common::Env;

const TOKEN: &str = "test-token";
const AMOUNT: &str = "1000";

/// A settled period and `n` queued payouts of [`AMOUNT`], one per
/// creator: each payout's id, creator, and the creator's balance before it.
pub(crate) async fn queued_payouts(env: &Env, n: i64) -> Vec<(i64, Address, U256)> {
    // Some seeded creators earn less than AMOUNT: a quarter more to pick from.
    let seeded = n + n / 4 + 8;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", &seeded.to_string()]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let server = env.serve(TOKEN).await;
    let creators = crate::common::creators_with_balance(env, n, AMOUNT).await;
    let mut made = Vec::new();
    for (i, creator) in creators.iter().enumerate() {
        let id = crate::common::create_payout(&server, TOKEN, &format!("chain-{i}"), creator, AMOUNT).await;
        made.push((
            id,
            creator.parse().unwrap(),
            balance(env, creator).await + U256::from(1000u32),
        ));
    }
    made
}

/// `settled deliver` on the chain through `url`, with the tests' short
/// leases, then `extra` flags.
pub(crate) fn deliver(env: &Env, chain: &TestChain, url: &str, confirmations: u32, extra: &[&str]) -> Deliverer {
    let mut args: Vec<String> = ["deliver"]
        .iter()
        .chain(crate::common::SHORT_LEASES)
        .chain(&["--concurrency", "3", "--batch", "4"])
        .map(|s| s.to_string())
        .collect();
    args.extend(chain.flags(url, confirmations));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Deliverer(env.cmd(&args).stdout(Stdio::null()).spawn().unwrap())
}

/// A `settled deliver` process, SIGKILLed (by its pid) if the test ends
/// while it still runs.
pub(crate) struct Deliverer(pub Child);

impl std::ops::Deref for Deliverer {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Deliverer {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Deliverer {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `creator`'s balance in settled.
pub(crate) async fn balance(env: &Env, creator: &str) -> U256 {
    let text: String = sqlx::query_scalar("SELECT balance::text FROM settlement.creator_balance WHERE creator = $1")
        .bind(creator)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    U256::from_str_radix(&text, 10).unwrap()
}

pub(crate) async fn count(env: &Env, sql: &str) -> i64 {
    env.scalar_i64(sql).await
}

// Each test crate uses some of them.
#[allow(unused_imports)]
pub(crate) use settled_testkit::chain::{deploy, logs, quantity, receipt, rpc, HOT_WALLET, HOT_WALLET_KEY, SUPPLY};

/// A chain for a test: anvil, the token, the hot wallet's key file.
pub(crate) struct TestChain {
    pub anvil: Anvil,
    pub token: Address,
    pub key_file: tempfile::NamedTempFile,
}

impl TestChain {
    /// anvil started with `anvil_args`, token `token_contract` deployed with
    /// the supply on the hot wallet, transfers to `refused` reverting.
    pub(crate) async fn start(anvil_args: &[&str], token_contract: &str, refused: Address) -> TestChain {
        let anvil = Anvil::start(anvil_args);
        let holder: Address = HOT_WALLET.parse().unwrap();
        let token = deploy(
            &anvil.url(),
            token_contract,
            (holder, U256::from(SUPPLY), refused).abi_encode_params(),
        )
        .await;
        let key_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(key_file.path(), format!("{HOT_WALLET_KEY}\n")).unwrap();
        std::fs::set_permissions(key_file.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        TestChain { anvil, token, key_file }
    }

    /// anvil mining only when the test says (`--no-mining`), the test
    /// token deployed, transfers to `0xeeee...` reverting.
    pub(crate) async fn unmined() -> TestChain {
        TestChain::start(&["--no-mining"], "TestToken", Address::repeat_byte(0xee)).await
    }

    /// The node's URL.
    pub(crate) fn url(&self) -> String {
        self.anvil.url()
    }

    /// `settled deliver`'s chain flags for node `url`.
    pub(crate) fn flags(&self, url: &str, confirmations: u32) -> Vec<String> {
        vec![
            "--chain-rpc-url".into(),
            url.into(),
            "--token-address".into(),
            format!("{:#x}", self.token),
            "--signer-key-file".into(),
            self.key_file.path().display().to_string(),
            "--confirmations".into(),
            confirmations.to_string(),
        ]
    }

    /// `owner`'s token balance, read from the chain.
    pub(crate) async fn balance_of(&self, owner: Address) -> U256 {
        let data = IERC20::balanceOfCall { owner }.abi_encode();
        let r = rpc(
            &self.url(),
            "eth_call",
            json!([{"to": self.token, "data": format!("0x{}", alloy_primitives::hex::encode(data))}, "latest"]),
        )
        .await;
        U256::from_str_radix(r.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    }

    /// Every `Transfer` of the token from the hot wallet on the canonical
    /// chain: (recipient, amount, transaction hash).
    pub(crate) async fn transfers_from_hot_wallet(&self) -> Vec<(Address, U256, String)> {
        let from = B256::left_padding_from(HOT_WALLET.parse::<Address>().unwrap().as_slice());
        logs(&self.url(), self.token, &[IERC20::Transfer::SIGNATURE_HASH, from])
            .await
            .into_iter()
            .map(|log| {
                let transfer = IERC20::Transfer::decode_raw_log(log.topics, &log.data).expect("a Transfer log");
                (transfer.to, transfer.value, log.transaction_hash)
            })
            .collect()
    }

    /// The hot wallet's count of mined transactions.
    pub(crate) async fn mined_nonce(&self) -> u64 {
        quantity(&rpc(&self.url(), "eth_getTransactionCount", json!([HOT_WALLET, "latest"])).await)
    }
}

/// What the proxy does with `eth_sendRawTransaction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Broadcasts {
    /// Forwarded, answered.
    Pass = 0,
    /// Never forwarded, never answered (a process killed before its broadcast left).
    Swallow = 1,
    /// Forwarded, its answer never given (killed before it recorded the broadcast).
    ForwardUnanswered = 2,
    /// The first signed bytes seen (and repeats of them) forwarded, any
    /// other answered 502: a replacement that never reaches the node.
    OnlyTheFirst = 3,
}

/// A JSON-RPC proxy in front of the node: everything passes but
/// broadcasts, which it treats as told, and what it is told to hide (a
/// node that lost its receipts, or its blocks' transactions).
pub(crate) struct RpcProxy {
    pub url: String,
    mode: Arc<AtomicU8>,
    hidden: Arc<AtomicU8>,
    task: tokio::task::JoinHandle<()>,
}

/// What the proxy hides, as bits of [`RpcProxy::hide`].
pub(crate) mod hide {
    /// Every `eth_getTransactionReceipt` answered `null`.
    pub(crate) const RECEIPTS: u8 = 1;
    /// Every block read with its transactions answered with none.
    pub(crate) const BLOCK_TRANSACTIONS: u8 = 2;
}

impl RpcProxy {
    pub(crate) async fn start(node: String) -> RpcProxy {
        let mode = Arc::new(AtomicU8::new(Broadcasts::Pass as u8));
        let hidden = Arc::new(AtomicU8::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Proxied {
            node,
            mode: mode.clone(),
            hidden: hidden.clone(),
            http: reqwest::Client::new(),
            first: Arc::new(std::sync::Mutex::new(None)),
        };
        let app = axum::Router::new()
            .route("/", axum::routing::post(forward))
            .with_state(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        RpcProxy {
            url,
            mode,
            hidden,
            task,
        }
    }

    pub(crate) fn set(&self, broadcasts: Broadcasts) {
        self.mode.store(broadcasts as u8, Ordering::SeqCst);
    }

    /// Hides what the bits of `what` ([`hide`]) say; 0 hides nothing.
    #[allow(dead_code)]
    pub(crate) fn hide(&self, what: u8) {
        self.hidden.store(what, Ordering::SeqCst);
    }
}

impl Drop for RpcProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Proxied {
    node: String,
    mode: Arc<AtomicU8>,
    hidden: Arc<AtomicU8>,
    http: reqwest::Client,
    first: Arc<std::sync::Mutex<Option<Value>>>,
}

async fn forward(
    axum::extract::State(Proxied {
        node,
        mode,
        hidden,
        http,
        first,
    }): axum::extract::State<Proxied>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let broadcast = request["method"] == "eth_sendRawTransaction";
    let mode = mode.load(Ordering::SeqCst);
    if broadcast && mode == Broadcasts::Swallow as u8 {
        std::future::pending::<()>().await;
    }
    if broadcast && mode == Broadcasts::OnlyTheFirst as u8 {
        let raw = request["params"][0].clone();
        let mut first = first.lock().unwrap();
        if first.get_or_insert_with(|| raw.clone()) != &raw {
            return axum::response::Response::builder()
                .status(502)
                .body(axum::body::Body::from("lost on the way"))
                .unwrap();
        }
    }
    let answer = match http
        .post(&node)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
    {
        Ok(response) => response.bytes().await,
        Err(err) => Err(err),
    };
    // The node down (restarting): the caller sees a failed call.
    let Ok(answer) = answer else {
        return axum::response::Response::builder()
            .status(502)
            .body(axum::body::Body::from("the node did not answer"))
            .unwrap();
    };
    if broadcast && mode == Broadcasts::ForwardUnanswered as u8 {
        std::future::pending::<()>().await;
    }
    let hidden = hidden.load(Ordering::SeqCst);
    let answer = if hidden & hide::RECEIPTS != 0 && request["method"] == "eth_getTransactionReceipt" {
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": request["id"], "result": null})).unwrap()
    } else if hidden & hide::BLOCK_TRANSACTIONS != 0
        && request["method"] == "eth_getBlockByNumber"
        && request["params"][1] == true
    {
        let mut answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        if answer["result"].is_object() {
            answer["result"]["transactions"] = json!([]);
        }
        serde_json::to_vec(&answer).unwrap()
    } else {
        answer.to_vec()
    };
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from(answer))
        .unwrap()
}

/// Each payout's creator and amount, and its state, as settled stores them.
pub(crate) async fn payouts(pool: &sqlx::PgPool) -> BTreeMap<i64, (Address, U256, String)> {
    let rows: Vec<(i64, String, String, String)> =
        sqlx::query_as("SELECT id, creator, amount::text, status FROM settlement.payouts ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(id, c, a, s)| (id, (c.parse().unwrap(), U256::from_str_radix(&a, 10).unwrap(), s)))
        .collect()
}

/// SIGKILL, by pid.
pub(crate) fn kill9(child: &mut std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = child.wait();
}

/// What the checks from the chain found, for a test's summary.
#[derive(Debug, Default)]
pub(crate) struct FromChain {
    /// Payouts paid, each by exactly one transfer of its amount.
    pub paid: usize,
    /// Payouts failed, whose creators received nothing and got their funds back.
    pub failed: usize,
    /// Transactions, one per nonce 0..n, all mined and final.
    pub nonces: i64,
    /// The hot wallet's token balance fell by this: the sum of paid payouts.
    pub paid_total: U256,
}

/// Checks from the chain alone (its `Transfer` logs and balances, read by
/// the test) against the payouts `made` (id, creator, settled balance
/// before): each paid payout's creator received exactly its amount, once;
/// each failed one received nothing and its funds are back in the ledger;
/// the hot wallet's balance fell by exactly the paid sum; one transaction
/// per nonce, none skipped, every one mined and final.
pub(crate) async fn check_from_chain(env: &Env, chain: &TestChain, made: &[(i64, Address, U256)]) -> FromChain {
    let transfers = chain.transfers_from_hot_wallet().await;
    let mut received: BTreeMap<Address, Vec<U256>> = BTreeMap::new();
    for (to, amount, _) in &transfers {
        received.entry(*to).or_default().push(*amount);
    }
    let stored = payouts(&env.pool).await;
    let mut found = FromChain::default();
    for (id, creator, before) in made {
        let (_, amount, state) = &stored[id];
        let got = received.get(creator).cloned().unwrap_or_default();
        let now = balance(env, &format!("{creator:#x}")).await;
        match state.as_str() {
            "paid" => {
                assert_eq!(got, vec![*amount], "payout {id}: its creator received its amount, once");
                assert_eq!(now, *before - *amount, "paid payout {id}: debited once");
                found.paid += 1;
                found.paid_total += *amount;
            }
            "failed" => {
                assert!(got.is_empty(), "failed payout {id} received nothing: {got:?}");
                assert_eq!(now, *before, "failed payout {id}: its funds are back, once");
                found.failed += 1;
            }
            other => panic!("payout {id} ended {other}"),
        }
    }
    assert_eq!(transfers.len(), found.paid, "no transfer that no paid payout explains");
    let hot: Address = HOT_WALLET.parse().unwrap();
    assert_eq!(chain.balance_of(hot).await, U256::from(SUPPLY) - found.paid_total);
    let (txs, min_nonce, max_nonce): (i64, i64, i64) =
        sqlx::query_as("SELECT count(*), min(nonce), max(nonce) FROM settlement.chain_txs")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        (min_nonce, max_nonce + 1),
        (0, txs),
        "nonces 0..{txs}, each once, none skipped"
    );
    assert_eq!(chain.mined_nonce().await, txs as u64, "every nonce mined, none stuck");
    let open = count(
        env,
        "SELECT count(*) FROM settlement.chain_txs WHERE state NOT IN ('confirmed', 'reverted', 'filled')",
    )
    .await;
    assert_eq!(open, 0, "every transaction final");
    found.nonces = txs;
    found
}

/// Mines one block.
pub(crate) async fn mine(chain: &TestChain) {
    rpc(&chain.url(), "evm_mine", json!([])).await;
}

/// Counts the payouts paid.
pub(crate) const PAID: &str = "SELECT count(*) FROM settlement.payouts WHERE status = 'paid'";

/// Mines a block every 200 ms until `sql` counts at least one row, `secs`
/// at most.
pub(crate) async fn mine_until(env: &Env, chain: &TestChain, secs: u64, what: &str, sql: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while count(env, sql).await == 0 {
        assert!(std::time::Instant::now() < deadline, "timed out mining until {what}");
        mine(chain).await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Mines a block every 200 ms until a payout is paid, `secs` at most.
pub(crate) async fn mine_until_paid(env: &Env, chain: &TestChain, secs: u64) {
    mine_until(env, chain, secs, "paid", PAID).await;
}

/// Waits (60 s at most) until `sql` counts `n` rows.
pub(crate) async fn wait_count(env: &Env, what: &str, sql: &str, n: i64) {
    crate::common::wait_until(60, what, || async { count(env, sql).await == n }).await;
}

/// Waits (60 s at most) until `n` chain transactions match `condition`
/// (SQL on `settlement.chain_txs`).
pub(crate) async fn wait_txs(env: &Env, condition: &str, n: i64) {
    let sql = format!("SELECT count(*) FROM settlement.chain_txs WHERE {condition}");
    wait_count(env, &format!("{n} transactions where {condition}"), &sql, n).await;
}

/// Drops the newest attempt under `nonce` from the node's pool (a node
/// that restarted or evicted it); its hash.
pub(crate) async fn drop_newest_attempt(env: &Env, chain: &TestChain, nonce: i64) -> String {
    let hash: String = sqlx::query_scalar(
        "SELECT a.hash FROM settlement.chain_tx_attempts a JOIN settlement.chain_txs t ON t.id = a.tx_id
         WHERE t.nonce = $1 ORDER BY a.attempt DESC LIMIT 1",
    )
    .bind(nonce) // $1
    .fetch_one(&env.pool)
    .await
    .unwrap();
    rpc(&chain.url(), "anvil_dropTransaction", json!([hash])).await;
    hash
}

/// Waits (60 s at most) until every payout is paid or failed.
pub(crate) async fn wait_paid_or_failed(env: &Env) {
    let open = "SELECT count(*) FROM settlement.payouts WHERE status NOT IN ('paid', 'failed')";
    wait_count(env, "every payout paid or failed", open, 0).await;
}

/// The one payout is paid, by one transfer on the chain of its amount to
/// `creator`.
pub(crate) async fn paid_once(env: &Env, chain: &TestChain, creator: Address) {
    assert_eq!(count(env, PAID).await, 1);
    let transfers = chain.transfers_from_hot_wallet().await;
    assert_eq!(transfers.len(), 1, "one transfer on the chain: {transfers:?}");
    assert_eq!((transfers[0].0, transfers[0].1), (creator, U256::from(1000u32)));
}
