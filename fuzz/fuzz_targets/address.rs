//! The address parser never panics, and what it accepts round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use settled::address::CreatorAddress;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(address) = CreatorAddress::parse(text) {
            assert_eq!(address.as_str(), text.to_ascii_lowercase());
            assert_eq!(CreatorAddress::parse(&address.to_checksummed()).unwrap(), address);
        }
    }
});
