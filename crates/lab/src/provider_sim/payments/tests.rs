//! The ledger's state machine and the create request's checks.

use settled::provider::PaymentStatus;

use super::*;

fn request(amount: &str) -> PaymentRequest {
    PaymentRequest {
        creator: "0xabc".into(),
        amount: amount.into(),
        reference: None,
    }
}

#[test]
fn a_final_state_never_changes() {
    let mut ledger = Ledger::default();
    let paid = ledger.accept("k1".into(), request("5"), 0).id;
    let failed = ledger.accept("k2".into(), request("6"), 0).id;
    let event = ledger.settle(&paid, Fate::Paid, 10).unwrap();
    assert_eq!(
        (event.r#type, event.data.status),
        (EventType::PaymentPaid, PaymentStatus::Paid)
    );
    let event = ledger
        .settle(&failed, Fate::Failed("account_closed".into()), 11)
        .unwrap();
    assert_eq!(event.data.failure_reason.as_deref(), Some("account_closed"));
    assert_ne!(event.id, "evt_000000000001", "each event has its own id");
    assert_eq!(ledger.settle(&paid, Fate::Failed("late".into()), 12), None);
    assert_eq!(ledger.settle(&failed, Fate::Paid, 12), None);
    assert_eq!(ledger.by_key("k1").unwrap().payment.status, PaymentStatus::Paid);
    let failed = &ledger.by_key("k2").unwrap().payment;
    assert_eq!(
        (failed.status, failed.failure_reason.as_deref()),
        (PaymentStatus::Failed, Some("account_closed"))
    );
}

#[test]
fn only_a_paid_payment_is_returned_and_a_return_never_changes() {
    let mut ledger = Ledger::default();
    let paid = ledger.accept("k1".into(), request("5"), 0).id;
    let pending = ledger.accept("k2".into(), request("6"), 0).id;
    ledger.settle(&paid, Fate::Paid, 1).unwrap();
    assert!(ledger.take_back(&pending, "bank".into(), false, 2).is_err(), "pending");
    let event = ledger.take_back(&paid, "account_closed".into(), false, 2).unwrap();
    assert_eq!(
        (event.r#type, event.data.status, event.data.failure_reason.as_deref()),
        (
            EventType::PaymentReturned,
            PaymentStatus::Returned,
            Some("account_closed")
        )
    );
    assert!(
        ledger.take_back(&paid, "again".into(), false, 3).is_err(),
        "returned once"
    );
    assert_eq!(ledger.settle(&paid, Fate::Paid, 3), None, "never paid again");
    // A provider without a returned status says failed.
    ledger.settle(&pending, Fate::Paid, 4).unwrap();
    let event = ledger.take_back(&pending, "bank".into(), true, 5).unwrap();
    assert_eq!(
        (event.r#type, event.data.status),
        (EventType::PaymentFailed, PaymentStatus::Failed)
    );
}

#[test]
fn a_forgotten_key_is_free_again_and_its_payment_is_still_found_by_reference() {
    let mut ledger = Ledger::default();
    let with_reference = PaymentRequest {
        reference: Some("ref-1".into()),
        ..request("5")
    };
    let first = ledger.accept("k".into(), with_reference.clone(), 1_000_000).id;
    assert!(ledger.remembered("k", 1_500_000, 1_000).is_some(), "within the window");
    assert!(ledger.remembered("k", 1_500_000, 0).is_some(), "0 keeps keys for ever");
    assert!(ledger.remembered("k", 2_000_001, 1_000).is_none(), "forgotten");
    assert_eq!(ledger.keys_forgotten, 1);
    let found: Vec<String> = ledger.by_reference("ref-1").into_iter().map(|p| p.id).collect();
    assert_eq!(found, std::slice::from_ref(&first));
    let second = ledger.accept("k".into(), with_reference, 2_000_002).id;
    let found: Vec<String> = ledger.by_reference("ref-1").into_iter().map(|p| p.id).collect();
    assert_eq!(found, [first, second], "a new payment under the forgotten key");
    assert!(ledger.by_reference("ref-2").is_empty());
}

#[test]
fn pages_follow_id_order_after_the_cursor() {
    let mut ledger = Ledger::default();
    let ids: Vec<String> = (0..12)
        .map(|i| ledger.accept(format!("k{i}"), request("1"), i).id)
        .collect();
    assert_eq!(ids[11], "pay_000000000012");
    let page =
        |after: Option<&str>, limit| -> Vec<String> { ledger.page(after, limit).into_iter().map(|p| p.id).collect() };
    assert_eq!(page(None, 5), ids[..5]);
    assert_eq!(page(Some(&ids[4]), 5), ids[5..10]);
    assert_eq!(page(Some(&ids[9]), 5), ids[10..]);
    assert!(page(Some(&ids[11]), 5).is_empty());
    assert_eq!(page(Some("pay_"), 2), ids[..2], "any text is a cursor");
}

#[test]
fn a_create_request_is_checked_and_its_amount_made_canonical() {
    let mut headers = HeaderMap::new();
    headers.insert("idempotency-key", "k-1".parse().unwrap());
    let (key, parsed) = parse_create(&headers, br#"{"creator":"0xabc","amount":"007"}"#).unwrap();
    assert_eq!((key.as_str(), parsed), ("k-1", request("7")));
    for (body, why) in [
        (r#"{"creator":"0xabc","amount":""}"#, "amount is empty"),
        (r#"{"creator":"0xabc","amount":"1.5"}"#, "amount must be a whole number"),
        (r#"{"creator":"0xabc","amount":7}"#, "body: invalid type"),
        (r#"{"creator":"","amount":"7"}"#, "creator must be"),
        (
            r#"{"creator":"0xabc","amount":"7","memo":"x"}"#,
            "body: unknown field `memo`",
        ),
    ] {
        let error = parse_create(&headers, body.as_bytes()).unwrap_err();
        assert!(error.starts_with(why), "{body}: {error}");
    }
    assert!(parse_create(&HeaderMap::new(), b"{}")
        .unwrap_err()
        .contains("missing Idempotency-Key"));
}
