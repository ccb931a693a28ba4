//! A creator's address: an EVM address, `0x` + 40 hex digits. All-lower or
//! all-upper case is accepted as is; mixed case must carry a valid EIP-55
//! checksum (it exists to catch typos). Stored lower-case.

use std::fmt;

use tiny_keccak::{Hasher, Keccak};

/// A validated creator address, lower-case.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CreatorAddress(String);

/// Why a text is not an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// No `0x` prefix.
    #[error("must start with 0x")]
    NoPrefix,
    /// Not 40 digits after the prefix.
    #[error("must have 40 hex digits after 0x, found {0}")]
    Length(usize),
    /// A character that is not a hex digit.
    #[error("{0:?} is not a hex digit")]
    NotHex(char),
    /// Mixed case that is not the EIP-55 checksum.
    #[error("mixed-case address fails its EIP-55 checksum (a typo?); expected {0}")]
    Checksum(String),
}

impl CreatorAddress {
    /// Parses and validates an address.
    pub fn parse(text: &str) -> Result<CreatorAddress, AddressError> {
        let digits = text.strip_prefix("0x").ok_or(AddressError::NoPrefix)?;
        if let Some(bad) = digits.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(AddressError::NotHex(bad));
        }
        if digits.len() != 40 {
            return Err(AddressError::Length(digits.chars().count()));
        }
        let lower = digits.to_ascii_lowercase();
        let has_upper = digits.chars().any(|c| c.is_ascii_uppercase());
        let has_lower = digits.chars().any(|c| c.is_ascii_lowercase());
        if has_upper && has_lower {
            let expected = checksummed(&lower);
            if expected[2..] != *digits {
                return Err(AddressError::Checksum(expected));
            }
        }
        Ok(CreatorAddress(format!("0x{lower}")))
    }

    /// The stored (lower-case) form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The EIP-55 checksummed form.
    pub fn to_checksummed(&self) -> String {
        checksummed(&self.0[2..])
    }
}

/// EIP-55: upper-case each letter whose nibble in keccak256(lower hex) is >= 8.
fn checksummed(lower_hex: &str) -> String {
    let mut hasher = Keccak::v256();
    hasher.update(lower_hex.as_bytes());
    let mut hash = [0u8; 32];
    hasher.finalize(&mut hash);
    let mut out = String::with_capacity(42);
    out.push_str("0x");
    for (i, c) in lower_hex.chars().enumerate() {
        let nibble = (hash[i / 2] >> (if i % 2 == 0 { 4 } else { 0 })) & 0x0f;
        out.push(if nibble >= 8 { c.to_ascii_uppercase() } else { c });
    }
    out
}

impl fmt::Display for CreatorAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn eip55_examples_pass_and_typos_fail() {
        // The examples of the EIP-55 specification.
        for good in [
            "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
            "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
            "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
            "0xD1220A0cf47c7B9Be7A2E6BA89F429762e7b9aDb",
        ] {
            let parsed = CreatorAddress::parse(good).unwrap();
            assert_eq!(parsed.as_str(), good.to_ascii_lowercase());
            assert_eq!(parsed.to_checksummed(), good);
        }
        assert!(matches!(
            CreatorAddress::parse("0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD"),
            Err(AddressError::Checksum(_))
        ));
        assert!(CreatorAddress::parse("0x5AAEB6053F3E94C9B9A09F33669435E7EF1BEAED").is_ok());
        assert_eq!(
            CreatorAddress::parse("5aaeb6053f3e94c9b9a09f33669435e7ef1beaed"),
            Err(AddressError::NoPrefix)
        );
        assert_eq!(CreatorAddress::parse("0x5aae"), Err(AddressError::Length(4)));
        assert_eq!(
            CreatorAddress::parse("0xzaaeb6053f3e94c9b9a09f33669435e7ef1beaed"),
            Err(AddressError::NotHex('z'))
        );
    }

    proptest! {
        #[test]
        fn checksummed_round_trips(bytes in any::<[u8; 20]>()) {
            let lower: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let address = CreatorAddress::parse(&format!("0x{lower}")).unwrap();
            let mixed = address.to_checksummed();
            prop_assert_eq!(CreatorAddress::parse(&mixed).unwrap(), address);
        }

        #[test]
        fn parser_never_panics(text in "\\PC{0,60}") {
            let _ = CreatorAddress::parse(&text);
        }
    }
}
