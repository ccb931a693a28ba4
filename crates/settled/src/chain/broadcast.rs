//! Broadcasting stored bytes, idempotently: the same signed bytes may be
//! sent any number of times (after a timeout, a crash, a restart, a node
//! that forgot them). The node's refusals that mean "I have it", "that
//! nonce is spent" or "these bytes can never be valid" are answers, read
//! here; only a failure to reach the node, or a refusal that says
//! something else (a fee under the base fee, funds short: states that
//! change), is an error. This module never signs and never writes.

use super::rpc::{Rpc, RpcError};

/// What the node said to signed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Taken into its pool now.
    Accepted,
    /// It has them already (or another attempt of the same nonce).
    AlreadyKnown,
    /// The nonce is spent: one of the attempts was mined (the follower of
    /// heads finds which), or the nonce was used outside settled.
    NonceUsed,
    /// The bytes break a rule of the chain that no fee, balance or
    /// rebroadcast changes (their gas limit above the block gas limit or
    /// under the intrinsic gas, their chain id, their signature): the
    /// nonce is given up (`give_up.rs`). The node's message.
    NeverValid(String),
}

/// The node's words (geth's, reth's and anvil's, lower-case) for signed
/// bytes that can never be valid on its chain.
pub(crate) const NEVER_VALID: [&str; 7] = [
    "exceeds block gas limit",
    "gas_limit > env.block.gas_limit",
    "intrinsic gas too low",
    "invalid chain id",
    "invalid signature",
    "invalid sender",
    "transaction type not supported",
];

/// Reads a refusal of `eth_sendRawTransaction`.
pub(crate) fn read_refusal(message: &str) -> Option<Sent> {
    let m = message.to_ascii_lowercase();
    if m.contains("nonce too low") || m.contains("nonce has already been used") {
        Some(Sent::NonceUsed)
    } else if m.contains("already known")
        || m.contains("already imported")
        || m.contains("known transaction")
        || m.contains("replacement transaction underpriced")
    {
        Some(Sent::AlreadyKnown)
    } else if NEVER_VALID.iter().any(|words| m.contains(words)) {
        Some(Sent::NeverValid(message.to_string()))
    } else {
        None
    }
}

/// Sends `raw` to the node.
pub(crate) async fn send(rpc: &Rpc, raw: &[u8]) -> Result<Sent, RpcError> {
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
        let too_big = "intrinsic gas too high -- tx.gas_limit > env.block.gas_limit";
        assert_eq!(read_refusal(too_big), Some(Sent::NeverValid(too_big.into())));
        assert_eq!(
            read_refusal("exceeds block gas limit"),
            Some(Sent::NeverValid("exceeds block gas limit".into()))
        );
        assert_eq!(read_refusal("max fee per gas less than block base fee"), None);
    }
}
