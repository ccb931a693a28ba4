//! The volume parser never panics, and what it accepts round-trips exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use settled::money::Amount;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(amount) = Amount::parse_decimal(text) {
            let canonical = amount.to_string();
            let significant = text.trim_start_matches('0');
            let expected = if significant.is_empty() { "0" } else { significant };
            assert_eq!(canonical, expected);
            assert_eq!(Amount::parse_decimal(&canonical).unwrap(), amount);
        }
    }
});
