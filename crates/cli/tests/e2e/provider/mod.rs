//! The provider protocol end to end: settled's client (`HttpProvider`) and
//! webhook verification (`signature::verify`) against `settled
//! provider-sim` run as its own process, with a webhook receiver in the test.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use common::{wait_until, ProviderSim, SETTLED};
use settled::money::Amount;
use settled::provider::signature::{verify, SignatureError, DEFAULT_TOLERANCE, SIGNATURE_HEADER};
use settled::provider::{EventType, HttpProvider, Payment, PaymentStatus, PayoutProvider, ProviderError, WebhookEvent};

mod payments;
mod webhooks;

fn client(sim: &ProviderSim) -> HttpProvider {
    HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap()
}

fn amount(text: &str) -> Amount {
    Amount::parse_decimal(text).unwrap()
}

async fn set_faults(sim: &ProviderSim, faults: Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/faults", sim.url))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204, "{}", response.text().await.unwrap());
}

async fn pay(provider: &HttpProvider, key: &str, amount_text: &str) -> Result<(Payment, bool), ProviderError> {
    provider.pay(key, "0xc1", amount(amount_text), None).await
}

/// The payment under `key` once it has ended.
async fn final_payment(provider: &HttpProvider, key: &str) -> Payment {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Some(payment) = provider.lookup(key).await.unwrap().filter(|p| p.status.is_final()) {
            return payment;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("payment {key} did not end");
}
