//! The node's JSON-RPC over HTTP: one call, its answer decoded, and the
//! node's error object kept apart from transport failures (a broadcast
//! reads the node's message: "already known" and "nonce too low" are
//! answers). What the calls mean lives with their callers; this module
//! never decides anything about a transaction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use alloy_primitives::{Address, Bytes, B256, U256, U64};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

/// How long one call to the node may take.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest answer read from the node: a receipt or a block header is a
/// few kilobytes, and a log query covers at most [`LOG_BLOCKS_PER_CALL`]
/// blocks. A longer answer is not read on, and the call has no answer.
pub const ANSWER_BYTES_MAX: usize = 16 * 1024 * 1024;
/// The blocks one `eth_getLogs` call covers; a longer range is read in
/// windows of this size, so each answer stays under [`ANSWER_BYTES_MAX`].
pub const LOG_BLOCKS_PER_CALL: u64 = 2_000;

/// Why a call has no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The node could not be reached, or answered something that is not JSON-RPC.
    #[error("the node at {url} did not answer {method}: {detail}")]
    Transport {
        /// The node.
        url: String,
        /// The call.
        method: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// The node answered with an error object.
    #[error("the node refused {method}: {message} (code {code})")]
    Node {
        /// The call.
        method: &'static str,
        /// Its code.
        code: i64,
        /// Its message.
        message: String,
    },
}

impl RpcError {
    /// The node's message, when it answered with an error object.
    pub fn node_message(&self) -> Option<&str> {
        match self {
            RpcError::Node { message, .. } => Some(message),
            RpcError::Transport { .. } => None,
        }
    }
}

/// A node reached over HTTP.
#[derive(Debug, Clone)]
pub struct Rpc {
    url: String,
    http: reqwest::Client,
    next_id: std::sync::Arc<AtomicU64>,
}

#[derive(Deserialize)]
struct Answer {
    result: Option<Value>,
    error: Option<NodeError>,
}

#[derive(Deserialize)]
struct NodeError {
    code: i64,
    message: String,
}

/// A mined transaction's receipt, as far as settled reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// The transaction's hash.
    pub transaction_hash: B256,
    /// Its block.
    pub block_number: U64,
    /// That block's hash.
    pub block_hash: B256,
    /// 1: succeeded; 0: reverted.
    pub status: U64,
    /// Gas used.
    pub gas_used: U64,
    /// The logs it emitted.
    #[serde(default)]
    pub logs: Vec<Log>,
}

impl Receipt {
    /// True when the transaction succeeded.
    pub fn succeeded(&self) -> bool {
        self.status == U64::from(1)
    }
}

/// One log of a block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Log {
    /// The contract that emitted it.
    pub address: Address,
    /// Its topics.
    pub topics: Vec<B256>,
    /// Its data.
    pub data: Bytes,
    /// Its block.
    pub block_number: Option<U64>,
    /// That block's hash.
    pub block_hash: Option<B256>,
    /// Its transaction.
    pub transaction_hash: Option<B256>,
    /// Its index in the block.
    pub log_index: Option<U64>,
}

/// A block header, as far as settled reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    /// Its number.
    pub number: U64,
    /// Its hash.
    pub hash: B256,
    /// Its base fee per gas.
    pub base_fee_per_gas: Option<U256>,
    /// Its gas limit.
    pub gas_limit: U64,
    /// Its time, seconds since the Unix epoch.
    #[serde(default)]
    pub timestamp: U64,
}

/// A block with its transactions, as far as settled reads them (to find
/// which transaction spent a nonce).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockTxs {
    /// Its number.
    pub number: U64,
    /// Its hash.
    pub hash: B256,
    /// Its transactions, in order.
    pub transactions: Vec<BlockTx>,
}

/// One transaction of a block: who sent it under which nonce.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockTx {
    /// Its hash.
    pub hash: B256,
    /// Its sender.
    pub from: Address,
    /// Its nonce.
    pub nonce: U64,
}

impl Rpc {
    /// A client of the node at `url`.
    pub fn new(url: &str) -> anyhow::Result<Rpc> {
        // A redirect is not the node's answer: it is never followed, and a
        // call answered with one has no answer (a broadcast is then sent
        // again, as after any doubt).
        let http = reqwest::Client::builder()
            .timeout(RPC_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Rpc {
            url: url.to_string(),
            http,
            next_id: std::sync::Arc::new(AtomicU64::new(1)),
        })
    }

    /// The node's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Calls `method` with `params` and decodes its result.
    pub async fn call<T: DeserializeOwned>(&self, method: &'static str, params: Value) -> Result<T, RpcError> {
        let transport = |detail: String| RpcError::Transport {
            url: self.url.clone(),
            method,
            detail,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let response = self
            .http
            .post(&self.url)
            .json(&body)
            .send()
            .await
            .map_err(|e| transport(e.to_string()))?;
        if !response.status().is_success() {
            return Err(transport(format!("HTTP status {}", response.status())));
        }
        let body = read_capped(response, ANSWER_BYTES_MAX).await.map_err(transport)?;
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| transport(e.to_string()))?;
        if let Some(NodeError { code, message }) = answer.error {
            return Err(RpcError::Node { method, code, message });
        }
        serde_json::from_value(answer.result.unwrap_or(Value::Null))
            .map_err(|e| transport(format!("unreadable result: {e}")))
    }

    /// The chain's id.
    pub async fn chain_id(&self) -> Result<u64, RpcError> {
        Ok(self.call::<U64>("eth_chainId", json!([])).await?.to())
    }

    /// The number of the newest block.
    pub async fn block_number(&self) -> Result<u64, RpcError> {
        Ok(self.call::<U64>("eth_blockNumber", json!([])).await?.to())
    }

    /// The canonical block at `number` (None: there is none yet).
    pub async fn header(&self, number: u64) -> Result<Option<Header>, RpcError> {
        self.call("eth_getBlockByNumber", json!([U64::from(number), false]))
            .await
    }

    /// The canonical block at `number` with its transactions (None: there
    /// is none).
    pub async fn block_txs(&self, number: u64) -> Result<Option<BlockTxs>, RpcError> {
        self.call("eth_getBlockByNumber", json!([U64::from(number), true]))
            .await
    }

    /// The logs of `address` with first topic `topic0` and second topic
    /// `topic1` in the block whose hash is `block` (EIP-234).
    pub async fn logs_in_block(
        &self,
        address: Address,
        topic0: B256,
        topic1: B256,
        block: B256,
    ) -> Result<Vec<Log>, RpcError> {
        self.call(
            "eth_getLogs",
            json!([{"address": address, "topics": [topic0, topic1], "blockHash": block}]),
        )
        .await
    }

    /// The newest block.
    pub async fn latest(&self) -> Result<Header, RpcError> {
        self.call::<Option<Header>>("eth_getBlockByNumber", json!(["latest", false]))
            .await?
            .ok_or_else(|| RpcError::Transport {
                url: self.url.clone(),
                method: "eth_getBlockByNumber",
                detail: "no latest block".into(),
            })
    }

    /// Transactions `address` sent in blocks up to `block` ("latest", "pending").
    pub async fn nonce(&self, address: Address, block: &str) -> Result<u64, RpcError> {
        Ok(self
            .call::<U64>("eth_getTransactionCount", json!([address, block]))
            .await?
            .to())
    }

    /// The tip the node suggests per gas.
    pub async fn max_priority_fee(&self) -> Result<U256, RpcError> {
        self.call("eth_maxPriorityFeePerGas", json!([])).await
    }

    /// Sends signed bytes; the node's answer is the transaction's hash.
    pub async fn send_raw(&self, raw: &[u8]) -> Result<B256, RpcError> {
        self.call("eth_sendRawTransaction", json!([Bytes::copy_from_slice(raw)]))
            .await
    }

    /// The receipt of the transaction `hash`, once it is mined.
    pub async fn receipt(&self, hash: B256) -> Result<Option<Receipt>, RpcError> {
        self.call("eth_getTransactionReceipt", json!([hash])).await
    }

    /// `address`'s balance of the chain's own coin (for gas), in wei.
    pub async fn balance(&self, address: Address) -> Result<U256, RpcError> {
        self.call("eth_getBalance", json!([address, "latest"])).await
    }

    /// The answer of a read-only call of `to` with `data`.
    pub async fn eth_call(&self, to: Address, data: Bytes) -> Result<Bytes, RpcError> {
        self.call("eth_call", json!([{"to": to, "data": data}, "latest"])).await
    }

    /// The gas a call of `to` with `data` from `from` uses now, by the
    /// node's estimate against its newest block.
    pub async fn estimate_gas(&self, from: Address, to: Address, data: Bytes) -> Result<u64, RpcError> {
        Ok(self
            .call::<U64>("eth_estimateGas", json!([{"from": from, "to": to, "data": data}]))
            .await?
            .to())
    }

    /// The logs of `address` with first topic `topic0` and, when given,
    /// second topic `topic1`, in blocks `from..=to`, read in windows of
    /// [`LOG_BLOCKS_PER_CALL`] blocks.
    pub async fn logs(
        &self,
        address: Address,
        topic0: B256,
        topic1: Option<B256>,
        from: u64,
        to: u64,
    ) -> Result<Vec<Log>, RpcError> {
        let topics = match topic1 {
            Some(t) => json!([topic0, t]),
            None => json!([topic0]),
        };
        let mut logs = Vec::new();
        let mut start = from;
        while start <= to {
            let end = to.min(start.saturating_add(LOG_BLOCKS_PER_CALL - 1));
            let window: Vec<Log> = self
                .call(
                    "eth_getLogs",
                    json!([{"address": address, "topics": topics, "fromBlock": U64::from(start), "toBlock": U64::from(end)}]),
                )
                .await?;
            logs.extend(window);
            start = end.saturating_add(1);
            if end == u64::MAX {
                break;
            }
        }
        Ok(logs)
    }
}

/// The body of `response`, read chunk by chunk, at most `bytes_max`.
async fn read_capped(mut response: reqwest::Response, bytes_max: usize) -> Result<Vec<u8>, String> {
    if response.content_length().is_some_and(|n| n > bytes_max as u64) {
        return Err(format!("the answer is longer than {bytes_max} bytes; not read"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > bytes_max {
            return Err(format!("the answer is longer than {bytes_max} bytes; not read"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on 127.0.0.1 that answers every request with `head` and
    /// then `body_bytes` bytes of JSON-looking text.
    async fn answering(head: &'static str, body_bytes: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = vec![0u8; 4096];
                let _ = socket.read(&mut request).await;
                let head = head.replace("{len}", &body_bytes.to_string());
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&vec![b' '; body_bytes]).await;
            }
        });
        url
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed_and_the_call_has_no_answer() {
        let url = answering(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:9/\r\nContent-Length: 0\r\n\r\n",
            0,
        )
        .await;
        let err = Rpc::new(&url).unwrap().chain_id().await.unwrap_err();
        assert!(
            matches!(&err, RpcError::Transport { detail, .. } if detail.contains("307")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_answer_over_the_cap_is_not_read() {
        let url = answering("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n", ANSWER_BYTES_MAX + 1).await;
        let err = Rpc::new(&url).unwrap().chain_id().await.unwrap_err();
        assert!(
            matches!(&err, RpcError::Transport { detail, .. } if detail.contains("longer than")),
            "{err}"
        );
        let url = answering("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", ANSWER_BYTES_MAX + 1).await;
        let err = Rpc::new(&url).unwrap().chain_id().await.unwrap_err();
        assert!(
            matches!(&err, RpcError::Transport { detail, .. } if detail.contains("longer than")),
            "{err}"
        );
    }
}
