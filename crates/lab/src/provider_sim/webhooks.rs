//! The simulator's webhooks: each event POSTed to the endpoint, signed
//! (`Provider-Signature`) with the endpoint's secret at each try, and tried
//! again with doubling waits until a 2xx answer. At the set rates an event
//! is lost (never sent), duplicated (sent twice) or held back by a random
//! delay (so later events overtake it); which ones is decided by the seed
//! and the payment's key, not by timing.

use std::time::Duration;

use axum::body::Bytes;
use serde::{Deserialize, Serialize};

use settled::provider::signature::{sign, SIGNATURE_HEADER};
use settled::provider::WebhookEvent;

use super::payments::unix_now;
use super::{chance, lock, Faults, Shared};

/// How long one webhook POST may take before it counts as not answered.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where webhooks go and the secret they are signed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookEndpoint {
    /// The receiver's URL (settled's is `http://HOST/v1/provider-events`).
    pub url: String,
    /// The shared secret.
    pub secret: String,
}

impl WebhookEndpoint {
    /// An http:// URL and a secret that is not blank.
    pub fn validate(&self) -> Result<(), String> {
        match url::Url::parse(&self.url) {
            Ok(url) if url.scheme() == "http" => {}
            _ => return Err(format!("the webhook URL {:?} must be an http:// URL", self.url)),
        }
        if self.secret.trim().is_empty() {
            return Err("the webhook secret must not be blank".into());
        }
        Ok(())
    }
}

/// Sends `event` as the faults say, each send in a task of its own.
pub(super) fn dispatch(sim: &Shared, event: WebhookEvent) {
    let delays = {
        let mut state = lock(sim);
        if state.webhook.is_none() {
            state.counters.webhooks_unsent += 1;
            return;
        }
        let subject = format!("{}:{}", event.data.idempotency_key, event.data.status);
        let delays = plan(state.seed, &state.faults, &subject);
        let counters = &mut state.counters;
        counters.webhooks_lost += u64::from(delays.is_empty());
        counters.webhooks_duplicated += u64::from(delays.len() > 1);
        counters.webhooks_reordered += delays.iter().filter(|d| !d.is_zero()).count() as u64;
        delays
    };
    let body = Bytes::from(serde_json::to_vec(&event).expect("an event serializes"));
    for delay in delays {
        tokio::spawn(send(sim.clone(), body.clone(), delay));
    }
}

/// The delay before each send of an event about `subject`: none when it is
/// lost, two when it is duplicated; a send held back waits a random delay
/// of up to `webhook_reorder_max_ms`, any other none.
fn plan(seed: u64, faults: &Faults, subject: &str) -> Vec<Duration> {
    if chance(seed, "webhook-loss", subject) < faults.webhook_loss_rate {
        return Vec::new();
    }
    let sends = if chance(seed, "webhook-duplicate", subject) < faults.webhook_duplicate_rate {
        2
    } else {
        1
    };
    (0..sends)
        .map(|send| {
            let subject = format!("{subject}#{send}");
            if chance(seed, "webhook-reorder", &subject) < faults.webhook_reorder_rate {
                let share = chance(seed, "webhook-delay", &subject);
                Duration::from_millis((share * faults.webhook_reorder_max_ms as f64) as u64 + 1)
            } else {
                Duration::ZERO
            }
        })
        .collect()
}

/// One send of an event: tried until a 2xx answer, `webhook_attempts_max`
/// tries, or the endpoint is removed.
async fn send(sim: Shared, body: Bytes, delay: Duration) {
    tokio::time::sleep(delay).await;
    let mut tries = 0;
    loop {
        let (client, endpoint, faults) = {
            let state = lock(&sim);
            (state.client.clone(), state.webhook.clone(), state.faults)
        };
        let Some(endpoint) = endpoint else {
            lock(&sim).counters.webhooks_abandoned += 1;
            return;
        };
        tries += 1;
        let acknowledged = post(&client, &endpoint, body.clone()).await;
        {
            let counters = &mut lock(&sim).counters;
            counters.webhook_attempts += 1;
            if acknowledged {
                counters.webhooks_delivered += 1;
                return;
            }
            counters.webhook_failures += 1;
            if tries >= faults.webhook_attempts_max {
                counters.webhooks_abandoned += 1;
                return;
            }
        }
        tokio::time::sleep(backoff(tries, &faults)).await;
    }
}

async fn post(client: &reqwest::Client, endpoint: &WebhookEndpoint, body: Bytes) -> bool {
    let signature = sign(endpoint.secret.as_bytes(), unix_now(), &body);
    client
        .post(&endpoint.url)
        .header(SIGNATURE_HEADER, signature)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .timeout(WEBHOOK_TIMEOUT)
        .send()
        .await
        .is_ok_and(|response| response.status().is_success())
}

/// `webhook_retry_base_ms` after the first failed try, doubling, at most
/// `webhook_retry_max_ms`.
fn backoff(tries: u32, faults: &Faults) -> Duration {
    let doublings = tries.saturating_sub(1).min(32);
    let ms = faults.webhook_retry_base_ms.saturating_mul(1u64 << doublings);
    Duration::from_millis(ms.min(faults.webhook_retry_max_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_wait_twice_as_long_each_time_up_to_the_cap() {
        let faults = Faults {
            webhook_retry_base_ms: 100,
            webhook_retry_max_ms: 1_000,
            ..Faults::default()
        };
        let waits: Vec<u64> = (1..=6).map(|t| backoff(t, &faults).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(backoff(u32::MAX, &faults), Duration::from_millis(1_000));
    }

    #[test]
    fn a_plan_follows_the_rates_and_the_seed() {
        let none = Faults::default();
        assert_eq!(plan(1, &none, "k:paid"), [Duration::ZERO]);
        let lose_all = Faults {
            webhook_loss_rate: 1.0,
            webhook_duplicate_rate: 1.0,
            ..Faults::default()
        };
        assert!(plan(1, &lose_all, "k:paid").is_empty());
        let everything = Faults {
            webhook_duplicate_rate: 1.0,
            webhook_reorder_rate: 1.0,
            webhook_reorder_max_ms: 50,
            ..Faults::default()
        };
        let delays = plan(1, &everything, "k:paid");
        assert_eq!(delays.len(), 2);
        assert!(
            delays.iter().all(|d| (1..=51).contains(&(d.as_millis() as u64))),
            "{delays:?}"
        );
        assert_eq!(plan(1, &everything, "k:paid"), delays, "the same seed, the same plan");
        let some = Faults {
            webhook_loss_rate: 0.3,
            ..Faults::default()
        };
        let lost = (0..1_000)
            .filter(|i| plan(9, &some, &format!("k{i}:paid")).is_empty())
            .count();
        assert!((250..350).contains(&lost), "{lost} of 1000 lost at 0.3");
    }
}
