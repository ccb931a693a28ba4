//! Money: exact integers only. A token amount is an unsigned 256-bit integer
//! (the range of an on-chain amount), stored as NUMERIC(78,0). Sums of many
//! amounts can exceed 256 bits and are arbitrary-precision. No floating point
//! anywhere on the money path.

use std::fmt;
use std::str::FromStr;

#[cfg(test)]
use num_bigint::BigUint;

/// An unsigned 256-bit integer.
pub type U256 = ruint::Uint<256, 4>;

/// Basis points in a whole (100%).
pub(crate) const BPS_PER_WHOLE: u16 = 10_000;
/// Digits of 2^256 - 1, the longest valid amount without leading zeros.
pub(crate) const MAX_AMOUNT_DIGITS: usize = 78;

/// A token amount in base units, 0 ..= 2^256 - 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Amount(U256);

/// Why a text is not an amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    /// Empty text.
    #[error("is empty")]
    Empty,
    /// A character other than the digits 0-9 (signs, points, exponents, spaces...).
    #[error("must be a whole number of base units written with the digits 0-9 only (found {0:?})")]
    NotDigits(char),
    /// Larger than 2^256 - 1.
    #[error("exceeds the largest token amount, 2^256 - 1")]
    TooLarge,
}

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount(U256::ZERO);
    /// 2^256 - 1.
    #[cfg(test)]
    pub(crate) const MAX: Amount = Amount(U256::MAX);

    /// Parses a plain decimal integer: digits only, no sign, point, exponent or separator.
    pub fn parse_decimal(text: &str) -> Result<Amount, AmountError> {
        if text.is_empty() {
            return Err(AmountError::Empty);
        }
        if let Some(bad) = text.chars().find(|c| !c.is_ascii_digit()) {
            return Err(AmountError::NotDigits(bad));
        }
        let significant = text.trim_start_matches('0');
        if significant.len() > MAX_AMOUNT_DIGITS {
            return Err(AmountError::TooLarge);
        }
        if significant.is_empty() {
            return Ok(Amount::ZERO);
        }
        U256::from_str_radix(significant, 10)
            .map(Amount)
            .map_err(|_| AmountError::TooLarge)
    }

    /// The 256-bit value.
    pub(crate) fn as_u256(self) -> U256 {
        self.0
    }

    /// From a 256-bit value.
    pub fn from_u256(value: U256) -> Amount {
        Amount(value)
    }

    /// As an arbitrary-precision integer.
    #[cfg(test)]
    pub(crate) fn to_biguint(self) -> BigUint {
        BigUint::from_bytes_le(&self.0.to_le_bytes::<32>())
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for Amount {
    type Err = AmountError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Amount::parse_decimal(s)
    }
}

/// A fee in basis points, 0 ..= 10000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FeeBps(u16);

impl FeeBps {
    /// Validates a fee in basis points.
    pub fn new(bps: u32) -> Result<FeeBps, String> {
        if bps > u32::from(BPS_PER_WHOLE) {
            return Err(format!("fee_bps must be 0..={BPS_PER_WHOLE}, got {bps}"));
        }
        Ok(FeeBps(bps as u16))
    }

    /// The basis points.
    pub(crate) fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for FeeBps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A creator's reward: floor(volume * fee_bps / 10000), exactly.
///
/// volume = q * 10000 + r, so volume * bps / 10000 = q * bps + r * bps / 10000,
/// where q * bps is whole. Neither product can overflow 256 bits, because
/// bps <= 10000 makes q * bps <= volume and r * bps < 10^8.
pub fn reward(volume: Amount, fee: FeeBps) -> Amount {
    let whole = U256::from(BPS_PER_WHOLE);
    let bps = U256::from(fee.0);
    let (q, r) = volume.0.div_rem(whole);
    let exact_part = q * bps;
    let rounded_part = (r * bps) / whole;
    let result = exact_part + rounded_part;
    assert!(result <= volume.0, "a reward can never exceed its volume");
    Amount(result)
}

/// Decimals of the token when none is configured (most ERC-20 tokens).
pub(crate) const DEFAULT_DECIMALS: u32 = 18;
/// Most decimals accepted.
pub(crate) const MAX_DECIMALS: u32 = 77;

/// Base units as whole tokens for people: `1234500000000000000` with 18
/// decimals reads `1.2345`. Exact (string arithmetic, no floats); trailing
/// zeros of the fraction are dropped. `units` is a non-negative decimal
/// integer as the database prints it; anything else is returned as is.
pub(crate) fn with_decimals(units: &str, decimals: u32) -> String {
    if units.is_empty() || !units.bytes().all(|b| b.is_ascii_digit()) {
        return units.to_string();
    }
    let digits = units.trim_start_matches('0');
    let d = decimals as usize;
    let padded = format!("{digits:0>width$}", width = d + 1);
    let (whole, fraction) = padded.split_at(padded.len() - d);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        whole.to_string()
    } else {
        format!("{whole}.{fraction}")
    }
}

/// Digits grouped in threes with commas: "1234567" reads "1,234,567".
/// Anything but a plain run of digits is returned as it is.
pub(crate) fn grouped(digits: &str) -> String {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return digits.to_string();
    }
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Most decimals [`tokens`] shows.
pub(crate) const SHOWN_DECIMALS: usize = 6;

/// An amount of base units as a person reads it: whole tokens grouped in
/// threes, at most `SHOWN_DECIMALS` decimals, and a trailing "…" when
/// digits were cut (the exact amount is in base units, shown beside it):
/// `tokens("1234567891234567890123", 18)` is "1,234.567891…".
pub fn tokens(units: &str, decimals: u32) -> String {
    let exact = with_decimals(units, decimals);
    let (whole, fraction) = match exact.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (exact.as_str(), ""),
    };
    if !whole.bytes().all(|b| b.is_ascii_digit()) {
        return exact;
    }
    let shown = &fraction[..fraction.len().min(SHOWN_DECIMALS)];
    let cut = if shown.len() < fraction.len() { "\u{2026}" } else { "" };
    if shown.is_empty() {
        format!("{}{cut}", grouped(whole))
    } else {
        format!("{}.{shown}{cut}", grouped(whole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn amounts_read_in_grouped_tokens_with_the_cut_shown() {
        assert_eq!(grouped("0"), "0");
        assert_eq!(grouped("999"), "999");
        assert_eq!(grouped("1000"), "1,000");
        assert_eq!(grouped("1234567"), "1,234,567");
        assert_eq!(grouped("12a"), "12a");
        assert_eq!(tokens("1234567891234567890123", 18), "1,234.567891\u{2026}");
        assert_eq!(tokens("1234500000000000000000", 18), "1,234.5");
        assert_eq!(tokens("1000000000000000000000000", 18), "1,000,000");
        assert_eq!(tokens("1", 18), "0.000000\u{2026}");
        assert_eq!(tokens("0", 18), "0");
        assert_eq!(tokens("1234", 0), "1,234");
    }

    #[test]
    fn base_units_read_as_whole_tokens() {
        assert_eq!(with_decimals("1234500000000000000", 18), "1.2345");
        assert_eq!(with_decimals("1", 18), "0.000000000000000001");
        assert_eq!(with_decimals("0", 18), "0");
        assert_eq!(with_decimals("000120", 2), "1.2");
        assert_eq!(with_decimals("5", 0), "5");
        assert_eq!(with_decimals("-", 18), "-");
        let huge = "9".repeat(90);
        assert_eq!(
            with_decimals(&huge, 18),
            format!("{}.{}", "9".repeat(72), "9".repeat(18))
        );
    }

    /// The oracle: multiply then divide in arbitrary precision.
    fn reward_by_bigint(volume: &BigUint, bps: u16) -> BigUint {
        volume * BigUint::from(bps) / BigUint::from(BPS_PER_WHOLE)
    }

    fn any_amount() -> impl Strategy<Value = Amount> {
        prop_oneof![
            any::<[u64; 4]>().prop_map(|limbs| Amount(U256::from_limbs(limbs))),
            any::<u64>().prop_map(|v| Amount(U256::from(v))),
            (0u64..20_000).prop_map(|v| Amount(U256::from(v))),
            (0u64..20_000).prop_map(|d| Amount(U256::MAX - U256::from(d))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn reward_matches_big_integer_arithmetic(volume in any_amount(), bps in 0u16..=10_000) {
            let fee = FeeBps::new(u32::from(bps)).unwrap();
            let ours = reward(volume, fee).to_biguint();
            prop_assert_eq!(ours, reward_by_bigint(&volume.to_biguint(), bps));
        }

        #[test]
        fn amount_text_round_trips(volume in any_amount()) {
            let text = volume.to_string();
            prop_assert_eq!(Amount::parse_decimal(&text), Ok(volume));
            prop_assert_eq!(volume.to_biguint().to_string(), text);
        }

        #[test]
        fn amount_parser_never_panics(text in "\\PC{0,100}") {
            let _ = Amount::parse_decimal(&text);
        }
    }

    #[test]
    fn amount_parser_refuses_what_is_not_a_plain_integer() {
        for bad in ["", "-1", "+1", "1.0", "1e3", " 1", "1 ", "0x10", "1_000", "١"] {
            assert!(Amount::parse_decimal(bad).is_err(), "{bad:?} accepted");
        }
        let max = "115792089237316195423570985008687907853269984665640564039457584007913129639935";
        assert_eq!(Amount::parse_decimal(max), Ok(Amount::MAX));
        let over = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
        assert_eq!(Amount::parse_decimal(over), Err(AmountError::TooLarge));
        assert_eq!(Amount::parse_decimal(&"9".repeat(79)), Err(AmountError::TooLarge));
        assert_eq!(Amount::parse_decimal("000"), Ok(Amount::ZERO));
    }

    #[test]
    fn reward_edges() {
        let full = FeeBps::new(10_000).unwrap();
        assert_eq!(reward(Amount::MAX, full), Amount::MAX);
        assert_eq!(reward(Amount::MAX, FeeBps::new(0).unwrap()), Amount::ZERO);
        assert_eq!(
            reward(Amount::parse_decimal("9999").unwrap(), FeeBps::new(1).unwrap()),
            Amount::ZERO
        );
        assert_eq!(
            reward(Amount::parse_decimal("10000").unwrap(), FeeBps::new(1).unwrap()).to_string(),
            "1"
        );
        assert!(FeeBps::new(10_001).is_err());
    }
}
