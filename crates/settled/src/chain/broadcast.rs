//! Broadcasting stored bytes, idempotently: the same signed bytes may be
//! sent any number of times (after a timeout, a crash, a restart, a node
//! that forgot them). The node's refusals that mean "I have it" or "that
//! nonce is spent" are answers, read here; only a failure to reach the
//! node, or a refusal that says something else, is an error. This module
//! never signs and never writes.

use super::rpc::{Rpc, RpcError};

/// What the node said to signed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Taken into its pool now.
    Accepted,
    /// It has them already (or another attempt of the same nonce).
    AlreadyKnown,
    /// The nonce is spent: one of the attempts was mined (the follower of
    /// heads finds which), or the nonce was used outside settled.
    NonceUsed,
}

/// Reads a refusal of `eth_sendRawTransaction`.
pub fn read_refusal(message: &str) -> Option<Sent> {
    let m = message.to_ascii_lowercase();
    if m.contains("nonce too low") || m.contains("nonce has already been used") {
        Some(Sent::NonceUsed)
    } else if m.contains("already known")
        || m.contains("already imported")
        || m.contains("known transaction")
        || m.contains("replacement transaction underpriced")
    {
        Some(Sent::AlreadyKnown)
    } else {
        None
    }
}

/// Sends `raw` to the node.
pub async fn send(rpc: &Rpc, raw: &[u8]) -> Result<Sent, RpcError> {
    match rpc.send_raw(raw).await {
        Ok(_) => Ok(Sent::Accepted),
        Err(err) => match err.node_message().and_then(read_refusal) {
            Some(sent) => Ok(sent),
            None => Err(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_refusals_that_mean_it_has_the_transaction_or_its_nonce_is_spent_are_answers() {
        assert_eq!(read_refusal("nonce too low"), Some(Sent::NonceUsed));
        assert_eq!(
            read_refusal("Nonce too low: next nonce 5, tx nonce 3"),
            Some(Sent::NonceUsed)
        );
        assert_eq!(read_refusal("already known"), Some(Sent::AlreadyKnown));
        assert_eq!(read_refusal("transaction already imported"), Some(Sent::AlreadyKnown));
        assert_eq!(
            read_refusal("replacement transaction underpriced"),
            Some(Sent::AlreadyKnown)
        );
        assert_eq!(read_refusal("insufficient funds for gas * price + value"), None);
        assert_eq!(read_refusal("max fee per gas less than block base fee"), None);
    }
}
