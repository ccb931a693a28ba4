//! External payouts: a payment provider that is called once per creator per
//! period with an idempotency key derived from (period, creator), so a retry,
//! a crash or a zombie worker can never make it pay twice.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::money::Amount;
use crate::period::Period;

/// Default time a provider call may take before it counts as timed out.
pub const DEFAULT_PROVIDER_TIMEOUT_MS: u64 = 2_000;

/// The idempotency key of a creator's payout for a period. Stable across
/// retries, workers and restarts.
pub fn payout_key(period: Period, creator: &str) -> String {
    format!("settled:{period}:{creator}")
}

/// One payment as the provider records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The provider's id.
    pub id: u64,
    /// The idempotency key it was first sent with.
    pub idempotency_key: String,
    /// Who was paid.
    pub creator: String,
    /// How much, in base units (decimal string).
    pub amount: String,
}

/// A payout request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentRequest {
    /// Who to pay.
    pub creator: String,
    /// How much, in base units (decimal string: amounts exceed 2^53).
    pub amount: String,
}

/// Why a payout did not go through (as far as the caller knows).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProviderError {
    /// Timed out, unavailable, or a 5xx: the payment may or may not have been
    /// applied; retrying with the same key is safe.
    #[error("provider unavailable or timed out: {0}")]
    Transient(String),
    /// The provider refused the request (4xx): retrying cannot help.
    #[error("provider refused the payment: {0}")]
    Refused(String),
}

/// A payment provider.
pub trait PayoutProvider: Send + Sync + 'static {
    /// Pays `amount` to `creator` under `key`. Calling again with the same key
    /// returns the first payment and pays nothing more.
    fn pay(
        &self,
        key: &str,
        creator: &str,
        amount: Amount,
    ) -> impl std::future::Future<Output = Result<Payment, ProviderError>> + Send;
}

/// A provider over HTTP: `POST {base}/v1/payments` with an `Idempotency-Key`
/// header and a JSON body `{"creator", "amount"}`.
#[derive(Debug, Clone)]
pub struct HttpProvider {
    base: String,
    client: reqwest::Client,
}

impl HttpProvider {
    /// A client for the provider at `base` (e.g. `http://127.0.0.1:9100`).
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<HttpProvider> {
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(HttpProvider {
            base: base.trim_end_matches('/').to_string(),
            client,
        })
    }

    /// Every payment the provider recorded (for reconciliation).
    pub async fn list_payments(&self) -> anyhow::Result<Vec<Payment>> {
        let response = self
            .client
            .get(format!("{}/v1/payments", self.base))
            .timeout(Duration::from_secs(60))
            .send()
            .await?
            .error_for_status()?;
        Ok(response.json().await?)
    }
}

impl PayoutProvider for HttpProvider {
    async fn pay(&self, key: &str, creator: &str, amount: Amount) -> Result<Payment, ProviderError> {
        let body = PaymentRequest {
            creator: creator.to_string(),
            amount: amount.to_string(),
        };
        let response = self
            .client
            .post(format!("{}/v1/payments", self.base))
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .map_err(|e| ProviderError::Transient(e.to_string()))?;
        let status = response.status();
        if status.is_success() {
            return response
                .json::<Payment>()
                .await
                .map_err(|e| ProviderError::Transient(format!("unreadable response: {e}")));
        }
        let text = response.text().await.unwrap_or_default();
        if status.is_server_error() || status.as_u16() == 409 || status.as_u16() == 429 {
            Err(ProviderError::Transient(format!("{status}: {text}")))
        } else {
            Err(ProviderError::Refused(format!("{status}: {text}")))
        }
    }
}
