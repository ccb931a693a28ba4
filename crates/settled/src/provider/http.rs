//! [`HttpProvider`]: the provider protocol over HTTP. It maps every answer
//! to one of the protocol's outcomes and never retries a payment itself:
//! the caller decides when to call again under the same key. Only listing,
//! which changes nothing, retries on its own. Each call is a
//! `provider.call` client span when traces are exported, and its
//! `traceparent` header names that span; otherwise the header passes on
//! the trace context the client was given.
//!
//! What the provider sends back is never trusted further than it must be:
//! a redirect is not followed (its 3xx is an unknown outcome, like any
//! status the protocol does not use), and an answer is read chunk by chunk
//! up to a cap, so a provider cannot make settled hold more than that.
//! Only a request that could not be built, and so never left, is refused;
//! whatever fails after sending leaves the outcome unknown.
//!
//! It is payout delivery's rail ([`Rail`]) as well as the settlement's
//! provider ([`PayoutProvider`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use tracing::Instrument;

use super::{Payment, PaymentRequest, PayoutProvider, ProviderError};
use crate::money::Amount;
use crate::payouts::{PayoutRow, Rail};

/// The wait after a 429 without a readable `Retry-After`.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest wait a `Retry-After` is taken for.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3_600);
/// Payments per page when the caller does not choose.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;
/// The most payments one page may ask for.
pub const MAX_PAGE_LIMIT: u32 = 1_000;
/// How long one page of a listing may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// Tries of one page in [`HttpProvider::list_all`] before it gives up.
const LIST_PAGE_TRIES_MAX: u32 = 6;
/// Pages [`HttpProvider::list_all`] reads at most ([`MAX_PAGE_LIMIT`]
/// payments each): a provider listing more is refused, so a listing that
/// never ends cannot hold reconciliation, nor its memory, forever.
pub(crate) const LIST_PAGES_MAX: u32 = 1_000;
/// The most bytes of one payment answer read (an answer is a few hundred).
pub(crate) const ANSWER_BYTES_MAX: usize = 64 * 1024;
/// The most bytes of one page read (a page of 1,000 payments is under 1 MiB).
pub(crate) const PAGE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Bytes of an error answer's body read for the error's text.
const ERROR_BODY_BYTES_MAX: usize = 4 * 1024;
/// Characters of an error answer's body kept in the error's text.
const ERROR_BODY_CHARS_MAX: usize = 512;

/// A provider over HTTP at a base URL (e.g. `http://127.0.0.1:9100`).
#[derive(Debug, Clone)]
pub struct HttpProvider {
    base: Arc<str>,
    client: reqwest::Client,
    traceparent: Option<HeaderValue>,
}

impl HttpProvider {
    /// A client for the provider at `base`, whose calls time out after `timeout`.
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<HttpProvider> {
        let url = url::Url::parse(base).with_context(|| format!("provider URL {base:?} is not a URL"))?;
        anyhow::ensure!(
            url.scheme() == "http",
            "provider URL {base:?} must be http:// (settled speaks plain HTTP to a provider or a local bridge)"
        );
        // A redirect is the provider's answer, not an address to send the
        // payment (its body and key) to: the 3xx is an unknown outcome.
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(HttpProvider {
            base: base.trim_end_matches('/').into(),
            client,
            traceparent: None,
        })
    }

    /// The same client, sending `traceparent` (a W3C trace context, such as
    /// the one a continuous-queue job stores) with every request, unless
    /// traces are exported (each call then sends its own span's). None, or
    /// a value that is not a valid traceparent, sends none: tracing never
    /// fails a payment. Cheap: the connection pool is shared.
    pub(crate) fn with_traceparent(&self, traceparent: Option<&str>) -> HttpProvider {
        let traceparent = traceparent
            .filter(|t| is_valid_traceparent(t))
            .and_then(|t| HeaderValue::from_str(t).ok());
        HttpProvider {
            traceparent,
            ..self.clone()
        }
    }

    /// One page of the provider's payments in id order: those after the id
    /// `after` (from the start when None), at most `limit` (1..=[`MAX_PAGE_LIMIT`]).
    /// `GET /v1/payments?after=ID&limit=N`.
    pub async fn list_page(&self, after: Option<&str>, limit: u32) -> anyhow::Result<Vec<Payment>> {
        anyhow::ensure!(
            (1..=MAX_PAGE_LIMIT).contains(&limit),
            "a page holds 1..={MAX_PAGE_LIMIT} payments, not {limit}"
        );
        let page = self
            .fetch_page(after, limit)
            .await
            .context("listing the provider's payments")?;
        check_page(&page, after, limit)?;
        Ok(page)
    }

    /// Every payment the provider has, in id order, page by page (for
    /// reconciliation), at most `LIST_PAGES_MAX` pages. A page the
    /// provider rate-limits or fails is asked again after a wait, a few times.
    pub async fn list_all(&self) -> anyhow::Result<Vec<Payment>> {
        let mut all: Vec<Payment> = Vec::new();
        for _ in 0..LIST_PAGES_MAX {
            let after = all.last().map(|p| p.id.clone());
            let page = self.fetch_page_patiently(after.as_deref(), MAX_PAGE_LIMIT).await?;
            check_page(&page, after.as_deref(), MAX_PAGE_LIMIT)?;
            let last_page = page.len() < MAX_PAGE_LIMIT as usize;
            all.extend(page);
            if last_page {
                return Ok(all);
            }
        }
        anyhow::bail!(
            "the provider listed more than {LIST_PAGES_MAX} pages of {MAX_PAGE_LIMIT} payments \
             ({} payments, and still more): settled reads at most {LIST_PAGES_MAX} pages",
            all.len()
        )
    }

    async fn fetch_page_patiently(&self, after: Option<&str>, limit: u32) -> anyhow::Result<Vec<Payment>> {
        let mut tries = 0;
        loop {
            tries += 1;
            let wait = match self.fetch_page(after, limit).await {
                Ok(page) => return Ok(page),
                Err(ProviderError::RateLimited { retry_after }) if tries < LIST_PAGE_TRIES_MAX => retry_after,
                Err(ProviderError::Transient(_)) if tries < LIST_PAGE_TRIES_MAX => DEFAULT_RETRY_AFTER,
                Err(e) => {
                    return Err(anyhow::Error::new(e))
                        .with_context(|| format!("listing the provider's payments (after {after:?}, try {tries})"))
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    async fn fetch_page(&self, after: Option<&str>, limit: u32) -> Result<Vec<Payment>, ProviderError> {
        let response = self
            .send("GET /v1/payments", None, || {
                let request = self
                    .request(Method::GET, "/v1/payments")
                    .query(&[("limit", limit)])
                    .timeout(LIST_TIMEOUT);
                match after {
                    Some(after) => request.query(&[("after", after)]),
                    None => request,
                }
            })
            .await?;
        if response.status() != StatusCode::OK {
            return Err(error_of(response).await);
        }
        let body = read_capped(response, PAGE_BYTES_MAX).await?;
        serde_json::from_slice(&body).map_err(|e| ProviderError::Transient(format!("unreadable page of payments: {e}")))
    }

    /// A request to `path`, with the current span's trace context when
    /// traces are exported, else the one this client was given.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.base));
        let traceparent = crate::telemetry::current_traceparent()
            .and_then(|t| HeaderValue::from_str(&t).ok())
            .or_else(|| self.traceparent.clone());
        match traceparent {
            Some(traceparent) => request.header("traceparent", traceparent),
            None => request,
        }
    }

    /// Sends what `build` makes in a `provider.call` span named `name`
    /// (`METHOD /path`), the payment's key as an attribute. A request that
    /// cannot be built never left: refused. Any failure once it is handed
    /// to the connection leaves the outcome unknown: transient.
    async fn send(
        &self,
        name: &'static str,
        key: Option<&str>,
        build: impl FnOnce() -> RequestBuilder,
    ) -> Result<Response, ProviderError> {
        let span = tracing::info_span!(
            "provider.call",
            otel.name = name,
            otel.kind = "client",
            provider.url = &*self.base,
            provider.key = key,
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let request = span
            .in_scope(build)
            .build()
            .map_err(|e| ProviderError::Refused(format!("the request cannot be sent: {e}")))?;
        let sent = self.client.execute(request).instrument(span.clone()).await;
        if let Ok(response) = &sent {
            span.record("http.response.status_code", response.status().as_u16());
        }
        if sent.as_ref().map_or(true, |r| r.status().as_u16() >= 400) {
            span.record("otel.status_code", "error");
        }
        sent.map_err(send_error)
    }
}

impl PayoutProvider for HttpProvider {
    async fn pay(
        &self,
        key: &str,
        creator: &str,
        amount: Amount,
        reference: Option<&str>,
    ) -> Result<(Payment, bool), ProviderError> {
        let body = PaymentRequest {
            creator: creator.to_string(),
            amount: amount.to_string(),
            reference: reference.map(str::to_string),
        };
        let response = self
            .send("POST /v1/payments", Some(key), || {
                self.request(Method::POST, "/v1/payments")
                    .header("Idempotency-Key", key)
                    .json(&body)
            })
            .await?;
        match response.status() {
            StatusCode::CREATED => Ok((read_payment(response).await?, true)),
            StatusCode::OK => Ok((read_payment(response).await?, false)),
            _ => Err(error_of(response).await),
        }
    }

    async fn lookup(&self, key: &str) -> Result<Option<Payment>, ProviderError> {
        let response = self
            .send("GET /v1/payments", Some(key), || {
                self.request(Method::GET, "/v1/payments")
                    .query(&[("idempotency_key", key)])
            })
            .await?;
        match response.status() {
            StatusCode::OK => Ok(Some(read_payment(response).await?)),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(error_of(response).await),
        }
    }

    async fn find_by_reference(&self, reference: &str) -> Result<Vec<Payment>, ProviderError> {
        let response = self
            .send("GET /v1/payments", None, || {
                self.request(Method::GET, "/v1/payments")
                    .query(&[("reference", reference)])
            })
            .await?;
        if response.status() != StatusCode::OK {
            return Err(error_of(response).await);
        }
        let body = read_capped(response, ANSWER_BYTES_MAX).await?;
        let found: Vec<Payment> = serde_json::from_slice(&body)
            .map_err(|e| ProviderError::Transient(format!("unreadable payments in the answer: {e}")))?;
        Ok(found
            .into_iter()
            .filter(|p| p.reference.as_deref() == Some(reference))
            .collect())
    }

    fn with_traceparent(&self, traceparent: Option<&str>) -> HttpProvider {
        HttpProvider::with_traceparent(self, traceparent)
    }
}

/// Delivery's rail: a payout's payment is `POST /v1/payments` under its
/// provider key, with its reference; its look-up is by that key, or by
/// the reference once the key may be forgotten.
impl Rail for HttpProvider {
    async fn send(&self, payout: &PayoutRow, traceparent: Option<&str>) -> Result<Payment, ProviderError> {
        let (payment, _created) = self
            .with_traceparent(traceparent)
            .pay(
                &payout.provider_key,
                payout.creator.as_str(),
                payout.amount,
                Some(&payout.reference),
            )
            .await?;
        Ok(payment)
    }

    async fn look_up(&self, payout: &PayoutRow) -> Result<Option<Payment>, ProviderError> {
        self.lookup(&payout.provider_key).await
    }

    async fn find(&self, payout: &PayoutRow) -> Result<Vec<Payment>, ProviderError> {
        self.find_by_reference(&payout.reference).await
    }
}

async fn read_payment(response: Response) -> Result<Payment, ProviderError> {
    let body = read_capped(response, ANSWER_BYTES_MAX).await?;
    serde_json::from_slice(&body)
        .map_err(|e| ProviderError::Transient(format!("unreadable payment in the answer: {e}")))
}

/// The body of `response`, read chunk by chunk, at most `bytes_max`: a
/// longer answer is not read on (the connection is dropped) and its
/// outcome is unknown.
async fn read_capped(mut response: Response, bytes_max: usize) -> Result<Vec<u8>, ProviderError> {
    let too_long = || ProviderError::Transient(format!("the answer is longer than {bytes_max} bytes; not read"));
    if response.content_length().is_some_and(|n| n > bytes_max as u64) {
        return Err(too_long());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(send_error)? {
        if body.len() + chunk.len() > bytes_max {
            return Err(too_long());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A failure after the request was handed to the connection (connect,
/// timeout, a broken or cut answer): the payment may exist, so the outcome
/// is unknown, never a refusal.
fn send_error(e: reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Transient(format!("timed out: {e}"))
    } else {
        ProviderError::Transient(e.to_string())
    }
}

/// The outcome of an answer that is not a success; its body is read only
/// up to [`ERROR_BODY_BYTES_MAX`], for the error's text.
async fn error_of(mut response: Response) -> ProviderError {
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_BYTES_MAX {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(ERROR_BODY_BYTES_MAX);
    error_for(status, &headers, &String::from_utf8_lossy(&body), SystemTime::now())
}

/// The protocol's outcome of an answer that is not a success: 429 rate
/// limited, 422 key conflict, any other 4xx a refusal, anything else
/// (5xx, a redirect, or a status the protocol does not use) transient.
fn error_for(status: StatusCode, headers: &HeaderMap, body: &str, now: SystemTime) -> ProviderError {
    let detail = format!(
        "{status}: {}",
        body.chars().take(ERROR_BODY_CHARS_MAX).collect::<String>()
    );
    match status.as_u16() {
        429 => ProviderError::RateLimited {
            retry_after: retry_after(headers.get(RETRY_AFTER).and_then(|v| v.to_str().ok()), now),
        },
        422 => ProviderError::KeyConflict(detail),
        400..=499 => ProviderError::Refused(detail),
        _ => ProviderError::Transient(detail),
    }
}

/// The wait a `Retry-After` asks for: delay-seconds or an HTTP date,
/// [`DEFAULT_RETRY_AFTER`] when absent or unreadable, at most [`MAX_RETRY_AFTER`].
fn retry_after(value: Option<&str>, now: SystemTime) -> Duration {
    let Some(value) = value.map(str::trim) else {
        return DEFAULT_RETRY_AFTER;
    };
    let wait = if let Ok(seconds) = value.parse::<u64>() {
        Duration::from_secs(seconds)
    } else if let Ok(date) = httpdate::parse_http_date(value) {
        date.duration_since(now).unwrap_or(Duration::ZERO)
    } else {
        DEFAULT_RETRY_AFTER
    };
    wait.min(MAX_RETRY_AFTER)
}

/// A page must hold at most `limit` payments with ids rising after `after`:
/// otherwise paging on could skip payments or never end.
fn check_page(page: &[Payment], after: Option<&str>, limit: u32) -> anyhow::Result<()> {
    anyhow::ensure!(
        page.len() <= limit as usize,
        "the provider listed {} payments for a page of {limit}",
        page.len()
    );
    let mut previous = after;
    for payment in page {
        if let Some(previous) = previous {
            anyhow::ensure!(
                payment.id.as_str() > previous,
                "the provider listed payment {:?} after {previous:?}: pages must be in rising id order",
                payment.id
            );
        }
        previous = Some(&payment.id);
    }
    Ok(())
}

/// A W3C trace context: `version-traceid-parentid-flags` in lowercase hex,
/// neither id all zeros; version 00 has exactly these four fields.
fn is_valid_traceparent(value: &str) -> bool {
    let fields: Vec<&str> = value.split('-').collect();
    let hex =
        |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    fields.len() >= 4
        && hex(fields[0], 2)
        && fields[0] != "ff"
        && (fields[0] != "00" || fields.len() == 4)
        && hex(fields[1], 32)
        && nonzero(fields[1])
        && hex(fields[2], 16)
        && nonzero(fields[2])
        && hex(fields[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    #[test]
    fn answers_map_to_the_protocols_outcomes() {
        let none = HeaderMap::new();
        let now = SystemTime::now();
        assert!(matches!(
            error_for(status(422), &none, "", now),
            ProviderError::KeyConflict(_)
        ));
        for code in [400, 401, 402, 403, 404, 409] {
            assert!(
                matches!(error_for(status(code), &none, "", now), ProviderError::Refused(_)),
                "{code}"
            );
        }
        // A redirect is never followed: its 3xx is an unknown outcome.
        for code in [500, 502, 503, 504, 301, 302, 303, 307, 308, 204] {
            assert!(
                matches!(error_for(status(code), &none, "", now), ProviderError::Transient(_)),
                "{code}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(
            error_for(status(429), &headers, "slow down", now),
            ProviderError::RateLimited {
                retry_after: Duration::from_secs(7)
            }
        );
        assert_eq!(
            error_for(status(429), &none, "", now),
            ProviderError::RateLimited {
                retry_after: DEFAULT_RETRY_AFTER
            }
        );
    }

    #[test]
    fn retry_after_reads_seconds_or_an_http_date_and_stays_bounded() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2026 07:28:00 GMT").unwrap();
        assert_eq!(retry_after(Some("120"), now), Duration::from_secs(120));
        assert_eq!(retry_after(Some(" 0 "), now), Duration::ZERO);
        assert_eq!(
            retry_after(Some("Wed, 21 Oct 2026 07:28:30 GMT"), now),
            Duration::from_secs(30)
        );
        // The obsolete forms HTTP still allows.
        assert_eq!(
            retry_after(Some("Wednesday, 21-Oct-26 07:29:00 GMT"), now),
            Duration::from_secs(60)
        );
        assert_eq!(
            retry_after(Some("Wed Oct 21 07:28:05 2026"), now),
            Duration::from_secs(5)
        );
        assert_eq!(
            retry_after(Some("Wed, 21 Oct 2026 07:00:00 GMT"), now),
            Duration::ZERO,
            "a date passed"
        );
        assert_eq!(retry_after(None, now), DEFAULT_RETRY_AFTER);
        assert_eq!(retry_after(Some("soon"), now), DEFAULT_RETRY_AFTER);
        assert_eq!(retry_after(Some("-5"), now), DEFAULT_RETRY_AFTER);
        assert_eq!(retry_after(Some("99999999"), now), MAX_RETRY_AFTER);
    }

    #[test]
    fn only_valid_traceparents_are_sent() {
        let provider = HttpProvider::new("http://127.0.0.1:9", Duration::from_secs(1)).unwrap();
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            provider.with_traceparent(Some(good)).traceparent.unwrap(),
            HeaderValue::from_static(good)
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
        ] {
            assert!(provider.with_traceparent(Some(bad)).traceparent.is_none(), "{bad:?}");
        }
        assert!(is_valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        ));
        assert!(provider.with_traceparent(None).traceparent.is_none());
    }

    #[test]
    fn only_plain_http_urls_make_a_client() {
        assert!(HttpProvider::new("http://127.0.0.1:9100/", Duration::from_secs(1)).is_ok());
        for bad in ["127.0.0.1:9100", "https://provider.example", "ftp://x", ""] {
            assert!(HttpProvider::new(bad, Duration::from_secs(1)).is_err(), "{bad:?}");
        }
    }

    fn payment(id: &str) -> Payment {
        Payment {
            id: id.into(),
            idempotency_key: format!("k-{id}"),
            creator: "c".into(),
            amount: "1".into(),
            status: super::super::PaymentStatus::Paid,
            failure_reason: None,
            reference: None,
        }
    }

    #[test]
    fn a_page_out_of_order_or_too_long_is_refused() {
        let page = [payment("pay_2"), payment("pay_3")];
        assert!(check_page(&page, Some("pay_1"), 2).is_ok());
        assert!(check_page(&page, Some("pay_2"), 2).is_err(), "not after the cursor");
        assert!(check_page(&page, None, 1).is_err(), "longer than the limit");
        assert!(
            check_page(&[payment("pay_3"), payment("pay_2")], None, 2).is_err(),
            "falling ids"
        );
        assert!(
            check_page(&[payment("pay_3"), payment("pay_3")], None, 2).is_err(),
            "a repeated id"
        );
    }
}
