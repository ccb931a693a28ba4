//! The document's address and amount patterns accept only what the parsers accept.

use super::*;

#[test]
fn the_documents_address_and_amount_patterns_accept_only_what_the_parsers_accept() {
    let doc = settled::api::openapi::document(24);
    let schema = |name: &str| {
        let mut schema = doc["components"]["schemas"][name].clone();
        schema["components"] = doc["components"].clone();
        jsonschema::draft202012::new(&schema).unwrap()
    };
    let (address, amount) = (schema("Address"), schema("Amount"));
    let addresses = [
        settled::api::openapi::EXAMPLE_CREATOR.to_string(),
        format!("0x{}", "AB".repeat(20)),
        format!("0x{}", "ab".repeat(20)),
        format!("0x{}", "a".repeat(39)),
        format!("0x{}", "g".repeat(40)),
        format!("0X{}", "a".repeat(40)),
        format!("0x{}", "Ab".repeat(20)),
    ];
    for text in &addresses {
        if address.is_valid(&json!(text)) {
            assert!(
                settled::address::CreatorAddress::parse(text).is_ok(),
                "{text}: the document's pattern admits an address the API refuses"
            );
        }
    }
    let all_upper = format!("0x{}", "AB".repeat(20));
    assert!(address.is_valid(&json!(all_upper)));
    let amounts = [
        "1",
        "007",
        "0",
        "",
        "1.5",
        "-1",
        "1e3",
        &"9".repeat(77),
        &"9".repeat(78),
    ];
    for text in amounts {
        if amount.is_valid(&json!(text)) {
            let parsed = settled::money::Amount::parse_decimal(text);
            assert!(
                parsed.is_ok_and(|a| a != settled::money::Amount::ZERO),
                "{text}: the document's pattern admits an amount the API refuses"
            );
        }
    }
    assert!(amount.is_valid(&json!("1")));
}
