//! The hot wallet's key: read from a file only its owner can read, never
//! printed (its address is what settled shows), and used to sign
//! transactions with alloy's local signer. This module signs; it never
//! stores or broadcasts.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use alloy_consensus::{SignableTransaction, TxEip1559, TxEnvelope};
use alloy_eips::eip2718::Encodable2718;
use alloy_primitives::{Address, B256};
use alloy_signer::SignerSync;
use alloy_signer_local::PrivateKeySigner;

/// Why a key file is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyFileError {
    /// It could not be read.
    #[error("reading the signer key file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Group or others may read it.
    #[error(
        "the signer key file {path} is readable by group or others (mode {mode:o}): chmod 600 it; \
         a hot wallet's key is its funds"
    )]
    Readable {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// It holds no private key (the key itself is never shown).
    #[error("the signer key file {path} does not hold a private key as 64 hex digits")]
    NotAKey {
        /// The file.
        path: String,
    },
}

/// The hot wallet: a signer and its address. Its `Debug` shows the address only.
#[derive(Clone)]
pub struct HotWallet {
    signer: PrivateKeySigner,
}

impl std::fmt::Debug for HotWallet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotWallet").field("address", &self.address()).finish()
    }
}

/// A signed transaction: its hash and the bytes a node takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signed {
    /// The transaction's hash.
    pub hash: B256,
    /// Its EIP-2718 encoding (what `eth_sendRawTransaction` takes).
    pub raw: Vec<u8>,
}

impl HotWallet {
    /// Reads the key in `path` (64 hex digits, `0x` optional, surrounding
    /// whitespace ignored), refusing a file group or others may read.
    pub(crate) fn from_key_file(path: &Path) -> Result<HotWallet, KeyFileError> {
        let shown = path.display().to_string();
        let read = |source| KeyFileError::Read {
            path: shown.clone(),
            source,
        };
        let mode = std::fs::metadata(path).map_err(read)?.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Readable { path: shown, mode });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        let hex = text.trim();
        let hex = hex.strip_prefix("0x").unwrap_or(hex);
        let not_a_key = || KeyFileError::NotAKey { path: shown.clone() };
        if hex.len() != 64 {
            return Err(not_a_key());
        }
        let signer: PrivateKeySigner = hex.parse().map_err(|_| not_a_key())?;
        Ok(HotWallet { signer })
    }

    /// The wallet's address.
    pub(crate) fn address(&self) -> Address {
        self.signer.address()
    }

    /// Signs `tx`.
    pub(crate) fn sign(&self, tx: TxEip1559) -> anyhow::Result<Signed> {
        let signature = self.signer.sign_hash_sync(&tx.signature_hash())?;
        let envelope = TxEnvelope::Eip1559(tx.into_signed(signature));
        Ok(Signed {
            hash: *envelope.tx_hash(),
            raw: envelope.encoded_2718(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    // anvil's first well-known development key (public test data).
    const DEV_KEY: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
    const DEV_ADDRESS: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";

    fn key_file(contents: &str, mode: u32) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), contents).unwrap();
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        file
    }

    #[test]
    fn a_key_file_only_its_owner_reads_gives_the_wallet_and_its_address() {
        let file = key_file(&format!("{DEV_KEY}\n"), 0o600);
        let wallet = HotWallet::from_key_file(file.path()).unwrap();
        assert_eq!(wallet.address().to_string().to_lowercase(), DEV_ADDRESS);
        assert!(
            !format!("{wallet:?}").contains(&DEV_KEY[2..]),
            "Debug never shows the key"
        );
    }

    #[test]
    fn a_key_file_group_or_others_can_read_is_refused_without_showing_the_key() {
        for mode in [0o640, 0o604, 0o644] {
            let file = key_file(DEV_KEY, mode);
            let err = HotWallet::from_key_file(file.path()).unwrap_err();
            assert!(matches!(err, KeyFileError::Readable { .. }), "{err}");
            assert!(!err.to_string().contains(&DEV_KEY[2..]));
        }
        let file = key_file("0x1234", 0o600);
        let err = HotWallet::from_key_file(file.path()).unwrap_err();
        assert!(matches!(err, KeyFileError::NotAKey { .. }), "{err}");
    }
}
