//! `POST /v1/provider-events`: the provider's webhooks. Each is signed
//! (`Provider-Signature`, HMAC-SHA256 over the timestamp and the raw body,
//! checked in constant time against one or two secrets, within a tolerance
//! of the timestamp); the header alone is judged before the body is read,
//! and the body has [`WEBHOOK_BODY_READ_TIMEOUT`], so a bad header cannot
//! hold a connection. Each event is applied once: its event id is the
//! primary key of `settlement.provider_events`, so a repeat finds its row,
//! changes nothing and answers 200. A signed event settled cannot apply (a
//! type it does not know, an empty id) is stored `ignored` and answered 200,
//! so the provider stops sending it; an id longer than the column takes is
//! stored as its digest (`stored_text`). The payout's state machine resolves order: a late or
//! repeated event changes nothing, and one contradicting a final state is
//! recorded as a conflict, never applied. Events for payouts settled does
//! not know are kept for review. Any non-2xx answer makes the provider send
//! the event again, so nothing is answered 2xx before it is committed.
//! With traces exported, applying an event is a `provider.event` span in
//! its payout's trace, so the trace of a payout ends with its webhook.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sqlx::PgConnection;
use tracing::Instrument;

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::openapi::TAG_PROVIDER;
use super::{read_body_within, AppState, Problem, ProblemType};
use crate::payouts::{self, word::word_of_event, Applied, Source};
use crate::provider::signature::{self, SignatureError, SignedHeader, SIGNATURE_HEADER};
use crate::provider::{EventType, WebhookEvent};

/// Time the provider has to send an event's whole body (at most
/// `super::MAX_BODY_BYTES`) once its signature header passed: an event
/// is small and sent at once, and a request whose body is read is never
/// evicted at the connection cap.
pub const WEBHOOK_BODY_READ_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest event id stored as it is (the column's check); a longer one is
/// stored as its digest.
pub(crate) const EVENT_ID_CHARS_MAX: usize = 255;
/// Longest event type stored as it is (the column's check).
pub(crate) const EVENT_TYPE_CHARS_MAX: usize = 100;

/// Counts refused signatures, by reason (a metric operators alert on).
fn signature_failed(reason: &'static str) {
    metrics::counter!("settled_webhook_signature_failures_total", "reason" => reason).increment(1);
}

/// What became of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventOutcome {
    /// Its payout moved.
    Applied,
    /// It said nothing new about its payout (a repeat, or a late word).
    Already,
    /// It contradicts its payout's final state: recorded, not applied.
    Conflict,
    /// No payout of settled's has its idempotency key: kept for review.
    UnknownPayout,
    /// Settled does not apply events of its type (or its id is empty): stored.
    Ignored,
    /// Its id was stored before: nothing changed.
    Duplicate,
}

impl EventOutcome {
    /// As stored in `settlement.provider_events.outcome` (all but
    /// `duplicate`, which stores nothing).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventOutcome::Applied => Applied::Moved.as_str(),
            EventOutcome::Already => Applied::Already.as_str(),
            EventOutcome::Conflict => Applied::Conflict.as_str(),
            EventOutcome::UnknownPayout => "unknown_payout",
            EventOutcome::Ignored => "ignored",
            EventOutcome::Duplicate => "duplicate",
        }
    }
}

impl From<Applied> for EventOutcome {
    fn from(applied: Applied) -> EventOutcome {
        match applied {
            Applied::Moved => EventOutcome::Applied,
            Applied::Already => EventOutcome::Already,
            Applied::Conflict => EventOutcome::Conflict,
        }
    }
}

/// The answer to an event: its id (as stored) and what became of it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct EventReceived {
    /// The event's id as stored (a digest for one too long or empty).
    pub id: String,
    /// What became of it.
    pub outcome: EventOutcome,
}

/// `POST /v1/provider-events`.
#[utoipa::path(post, path = "/v1/provider-events", operation_id = "receive_provider_event", tag = TAG_PROVIDER,
    summary = "The provider's signed webhook: applied to its payout once per event id",
    params(("Provider-Signature" = String, Header,
        description = "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<raw body>\"> (one v1 per secret while rotating)")),
    request_body(content = WebhookEvent,
        description = "the event; one of a type settled does not apply is stored as ignored and answered 200"),
    responses(
        (status = 200, description = "recorded (a repeat changes nothing)", body = EventReceived),
        (status = 400, description = "the signature header is missing (missing-signature) or does not hold (bad-signature), or the signed event is not valid (malformed-event)"),
        (status = 408, description = "the body did not arrive in time (body-timeout); the connection is closed"),
        (status = 413, description = "body too large (body-too-large)"),
        (status = 503, description = "retry: webhooks are not configured here (webhooks-not-configured), or the database failed; the provider sends the event again"),
    ))]
pub(crate) async fn receive(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let Some(secrets) = state.webhook_secrets.clone() else {
        return Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ProblemType::WebhooksNotConfigured,
            "Webhooks are not configured",
            "set SETTLED_PROVIDER_WEBHOOK_SECRET on this server; the provider will send the event again",
        ));
    };
    let signed = signature_header(&headers)?;
    let raw = read_body_within(body, WEBHOOK_BODY_READ_TIMEOUT).await?;
    signed.verify_body(&raw, &secrets).map_err(bad_signature)?;
    let (id, outcome) = match Incoming::parse(&raw)? {
        Incoming::Applicable(event) => (event.id.clone(), record(&state, &event, &raw).await),
        Incoming::Ignored(ignored) => (ignored.id.clone(), store_ignored(&state, &ignored, &raw).await),
    };
    let outcome = outcome.map_err(Problem::unavailable)?;
    Ok((StatusCode::OK, axum::Json(EventReceived { id, outcome })).into_response())
}

/// The signature header, judged alone (present, well formed, dated within
/// the tolerance) before the body is read.
fn signature_header(headers: &HeaderMap) -> Result<SignedHeader, Problem> {
    let Some(header) = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok()) else {
        signature_failed("missing");
        return Err(Problem::bad_request(
            ProblemType::MissingSignature,
            format!("the {SIGNATURE_HEADER} header is required"),
        )
        .field(SIGNATURE_HEADER));
    };
    let now = chrono::Utc::now().timestamp();
    signature::check_header(header, now, signature::DEFAULT_TOLERANCE).map_err(bad_signature)
}

/// 400 `bad-signature`, counted by its reason.
fn bad_signature(err: SignatureError) -> Problem {
    signature_failed(err.kind());
    Problem::new(
        StatusCode::BAD_REQUEST,
        ProblemType::BadSignature,
        "The signature does not hold",
        err.to_string(),
    )
    .field(SIGNATURE_HEADER)
}

/// A signed event, as settled takes it.
enum Incoming {
    /// An event of a type settled applies, under the id it is stored by.
    Applicable(WebhookEvent),
    /// One it stores and does not apply.
    Ignored(Ignored),
}

/// A signed event settled stores `ignored`, and why.
struct Ignored {
    id: String,
    r#type: String,
    created: i64,
    detail: String,
}

/// The members every event has, whatever its type.
#[derive(serde::Deserialize)]
struct Envelope {
    id: String,
    r#type: String,
    created: i64,
}

impl Incoming {
    /// The event, read strictly (a member named twice is refused): its
    /// envelope first, then, for a type settled applies, the whole event.
    fn parse(raw: &[u8]) -> Result<Incoming, Problem> {
        let object = crate::json::parse_object(raw)
            .map_err(|e| Problem::bad_request(ProblemType::MalformedEvent, format!("the event is not valid: {e:?}")))?;
        let value = serde_json::Value::Object(object);
        let envelope: Envelope = serde_path_to_error::deserialize(&value).map_err(malformed)?;
        if envelope.id.is_empty() {
            return Ok(Incoming::Ignored(Ignored {
                id: format!("body-sha256:{}", sha256_hex(raw)),
                r#type: stored_text(&envelope.r#type, EVENT_TYPE_CHARS_MAX),
                created: envelope.created,
                detail: "the event's id is empty, so no repeat of it could be recognised".into(),
            }));
        }
        let id = stored_text(&envelope.id, EVENT_ID_CHARS_MAX);
        if serde_json::from_value::<EventType>(serde_json::Value::String(envelope.r#type.clone())).is_err() {
            let r#type = stored_text(&envelope.r#type, EVENT_TYPE_CHARS_MAX);
            let detail = format!("settled does not apply events of type {type:?}");
            return Ok(Incoming::Ignored(Ignored {
                id,
                r#type,
                created: envelope.created,
                detail,
            }));
        }
        let mut event: WebhookEvent = serde_path_to_error::deserialize(value).map_err(malformed)?;
        event.id = id;
        Ok(Incoming::Applicable(event))
    }
}

/// 400 `malformed-event` naming the member at fault.
fn malformed(e: serde_path_to_error::Error<serde_json::Error>) -> Problem {
    Problem::bad_request(
        ProblemType::MalformedEvent,
        format!("the event's {}: {}", e.path(), e.inner()),
    )
}

/// `text` as a column of at most `chars_max` characters stores it: itself,
/// or `sha256:<hex>` of it when it is longer or holds a NUL (which no text
/// column takes). The whole event stays in the stored body.
pub(crate) fn stored_text(text: &str, chars_max: usize) -> String {
    if text.chars().count() <= chars_max && !text.contains('\0') {
        text.to_string()
    } else {
        format!("sha256:{}", sha256_hex(text.as_bytes()))
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Stores an event settled does not apply as `ignored`, once; a repeat
/// (its id already stored) changes nothing. Returns the outcome.
async fn store_ignored(state: &AppState, ignored: &Ignored, raw: &[u8]) -> anyhow::Result<EventOutcome> {
    let body: serde_json::Value = serde_json::from_slice(raw)?;
    let tx = super::begin(state).await?;
    let insert = sqlx::query(
        "INSERT INTO settlement.provider_events (id, type, created, outcome, detail, body)
         VALUES ($1, $2, $3, 'ignored', $4, $5)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&ignored.id) // $1
    .bind(&ignored.r#type) // $2
    .bind(ignored.created) // $3
    .bind(&ignored.detail) // $4
    .bind(body); // $5
    if !store_once(state, tx, insert).await? {
        return Ok(EventOutcome::Duplicate);
    }
    tracing::warn!(event = %ignored.id, detail = %ignored.detail, "a provider event was stored and ignored");
    Ok(EventOutcome::Ignored)
}

/// Applies `event` and stores it under its id, in one transaction; a
/// repeat (its id already stored) changes nothing. Returns the outcome.
async fn record(state: &AppState, event: &WebhookEvent, raw: &[u8]) -> anyhow::Result<EventOutcome> {
    let mut tx = super::begin(state).await?;
    let payout = payouts::by_provider_key(&mut tx, &event.data.idempotency_key).await?;
    let span = event_span(&mut tx, event, payout).await?;
    let outcome = apply(state, tx, event, raw, payout).instrument(span.clone()).await?;
    span.record("outcome", outcome.as_str());
    Ok(outcome)
}

/// The `provider.event` span of applying `event`: a child of its payout's
/// stored trace, linked to the request that brought it. Disabled (and no
/// lookup made) when traces are off.
async fn event_span(
    conn: &mut PgConnection,
    event: &WebhookEvent,
    payout: Option<i64>,
) -> anyhow::Result<tracing::Span> {
    let span = tracing::info_span!(
        "provider.event",
        event.id = %event.id,
        "event.type" = event.r#type.as_str(),
        payout.id = payout,
        outcome = tracing::field::Empty,
    );
    if span.is_disabled() {
        return Ok(span);
    }
    if let Some(id) = payout {
        if let Some(traceparent) = payouts::traceparent_of(conn, id).await? {
            crate::telemetry::continue_from(&span, &traceparent);
        }
    }
    span.follows_from(tracing::Span::current());
    Ok(span)
}

/// Runs `insert`, the event's `INSERT ... ON CONFLICT (id) DO NOTHING`, in
/// `tx`, and commits; for a repeat (its id already stored) rolls back
/// instead and returns false.
async fn store_once(
    state: &AppState,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    insert: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> anyhow::Result<bool> {
    if insert.execute(&mut *tx).await?.rows_affected() == 0 {
        tx.rollback().await?;
        return Ok(false);
    }
    super::commit(state, tx).await?;
    Ok(true)
}

/// Applies the event to `payout` and stores it, committing `tx`.
async fn apply(
    state: &AppState,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    event: &WebhookEvent,
    raw: &[u8],
    payout: Option<i64>,
) -> anyhow::Result<EventOutcome> {
    let key = &event.data.idempotency_key;
    let outcome = match payout {
        None => EventOutcome::UnknownPayout,
        Some(id) if !payouts::payment_matches(&mut tx, id, &event.data, Source::Webhook, Some(&event.id)).await? => {
            EventOutcome::Conflict
        }
        Some(id) => payouts::apply_word(&mut tx, id, &word_of_event(event), Source::Webhook, Some(&event.id))
            .await?
            .into(),
    };
    let body: serde_json::Value = serde_json::from_slice(raw)?;
    let insert = sqlx::query(
        "INSERT INTO settlement.provider_events (id, type, created, provider_key, payout_id, outcome, body)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&event.id) // $1
    .bind(event.r#type.as_str()) // $2
    .bind(event.created) // $3
    .bind(key) // $4
    .bind(payout) // $5
    .bind(outcome.as_str()) // $6
    .bind(body); // $7
    if !store_once(state, tx, insert).await? {
        return Ok(EventOutcome::Duplicate);
    }
    if matches!(outcome, EventOutcome::Conflict | EventOutcome::UnknownPayout) {
        tracing::warn!(event = %event.id, key = %key, outcome = outcome.as_str(), "a provider event needs review");
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_too_long_for_its_column_or_holding_a_nul_is_stored_as_its_digest() {
        let at_limit = "é".repeat(EVENT_ID_CHARS_MAX);
        assert_eq!(
            stored_text(&at_limit, EVENT_ID_CHARS_MAX),
            at_limit,
            "characters, not bytes"
        );
        // Computed apart from this crate: printf 'abc' | sha256sum.
        let abc = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(stored_text("abc", 2), abc);
        assert_eq!(stored_text("a\0b", 10), format!("sha256:{}", sha256_hex(b"a\0b")));
        let long = "e".repeat(EVENT_ID_CHARS_MAX + 1);
        assert_eq!(stored_text(&long, EVENT_ID_CHARS_MAX).len(), "sha256:".len() + 64);
    }
}
