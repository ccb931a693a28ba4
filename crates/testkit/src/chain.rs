//! What the chain rail's tests and its bench share on a node they
//! started: anvil's development accounts, the contracts' checked-in
//! bytecode, JSON-RPC calls of their own (the chain read by the caller,
//! not through the code under test), and deploying a contract.

use std::path::PathBuf;
use std::time::Duration;

use alloy_primitives::{Address, Bytes, B256};
use serde_json::{json, Value};

/// anvil's well-known development accounts (public test data): the first
/// deploys, the second is the hot wallet.
pub const DEPLOYER: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";
/// The hot wallet's private key.
pub const HOT_WALLET_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
/// The hot wallet's address.
pub const HOT_WALLET: &str = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";
/// The hot wallet's token supply.
pub const SUPPLY: u128 = 1_000_000_000_000_000_000_000;
/// Gas given to a deployment.
const DEPLOY_GAS: &str = "0x2dc6c0";
/// Polls for a receipt, and the pause between two, in ms.
const RECEIPT_POLLS: u32 = 600;
const RECEIPT_POLL_MS: u64 = 50;

/// The checked-in bytecode of a contract of `contracts/`.
pub fn bytecode(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../contracts/build/{name}.bin"));
    let hex = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    alloy_primitives::hex::decode(hex.trim()).expect("hex bytecode")
}

/// Calls the node.
pub async fn rpc(url: &str, method: &str, params: Value) -> Value {
    let answer: Value = reqwest::Client::new()
        .post(url)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method}: {e}"))
        .json()
        .await
        .unwrap();
    if let Some(error) = answer.get("error") {
        panic!("{method} refused: {error}");
    }
    answer["result"].clone()
}

/// A quantity the node answered (`0x..`).
pub fn quantity(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().expect("a quantity").trim_start_matches("0x"), 16).unwrap()
}

/// Waits for the receipt of `hash`.
pub async fn receipt(url: &str, hash: &str) -> Value {
    for _ in 0..RECEIPT_POLLS {
        let r = rpc(url, "eth_getTransactionReceipt", json!([hash])).await;
        if !r.is_null() {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(RECEIPT_POLL_MS)).await;
    }
    panic!("no receipt for {hash}");
}

/// A log the node answered to `eth_getLogs`.
#[derive(Debug, Clone)]
pub struct Log {
    /// Its topics (the event's signature hash first).
    pub topics: Vec<B256>,
    /// Its data.
    pub data: Bytes,
    /// The hash of the transaction that emitted it (`0x..`).
    pub transaction_hash: String,
}

/// Every log of the contract at `address` whose first topics are `topics`,
/// on the canonical chain from its first block to the latest.
pub async fn logs(url: &str, address: Address, topics: &[B256]) -> Vec<Log> {
    let filter = json!([{"address": address, "topics": topics, "fromBlock": "0x0", "toBlock": "latest"}]);
    let logs = rpc(url, "eth_getLogs", filter).await;
    logs.as_array()
        .expect("a list of logs")
        .iter()
        .map(|log| Log {
            topics: serde_json::from_value(log["topics"].clone()).unwrap(),
            data: serde_json::from_value(log["data"].clone()).unwrap(),
            transaction_hash: log["transactionHash"].as_str().unwrap().to_string(),
        })
        .collect()
}

/// Deploys `name` with constructor arguments `args` (ABI-encoded) from
/// the deployer; its address.
pub async fn deploy(url: &str, name: &str, args: Vec<u8>) -> Address {
    let mut data = bytecode(name);
    data.extend(args);
    let hash = rpc(
        url,
        "eth_sendTransaction",
        json!([{"from": DEPLOYER, "data": format!("0x{}", alloy_primitives::hex::encode(data)), "gas": DEPLOY_GAS}]),
    )
    .await;
    // Mined at once, whether the node mines by itself or not.
    rpc(url, "evm_mine", json!([])).await;
    let r = receipt(url, hash.as_str().unwrap()).await;
    assert_eq!(r["status"], "0x1", "deploying {name}: {r}");
    r["contractAddress"].as_str().unwrap().parse().unwrap()
}
