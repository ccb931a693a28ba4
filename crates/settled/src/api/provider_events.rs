//! `POST /v1/provider-events`: the provider's webhooks. Each is signed
//! (`Provider-Signature`, HMAC-SHA256 over the timestamp and the raw body,
//! checked in constant time against one or two secrets, within a tolerance
//! of the timestamp) and applied once: its event id is the primary key of
//! `settlement.provider_events`, so a repeat finds its row, changes nothing
//! and answers 200. The payout's state machine resolves order: a late or
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

use super::{read_body, AppState, Problem};
use crate::payouts::{self, deliver::word_of, Applied, ProviderWord, Source};
use crate::provider::signature::{self, SIGNATURE_HEADER};
use crate::provider::{EventType, WebhookEvent};

/// Counts refused signatures, by reason (a metric operators alert on).
fn signature_failed(reason: &'static str) {
    metrics::counter!("settled_webhook_signature_failures_total", "reason" => reason).increment(1);
}

/// `POST /v1/provider-events`.
pub async fn receive(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Result<Response, Problem> {
    let Some(secrets) = state.webhook_secrets.clone() else {
        return Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "webhooks-not-configured",
            "Webhooks are not configured",
            "set SETTLED_PROVIDER_WEBHOOK_SECRET on this server; the provider will send the event again",
        ));
    };
    // The signature's presence is checked before the body is read.
    let Some(header) = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        signature_failed("missing");
        return Err(Problem::bad_request(
            "missing-signature",
            format!("the {SIGNATURE_HEADER} header is required"),
        )
        .field(SIGNATURE_HEADER));
    };
    let raw = read_body(body).await?;
    let now = chrono::Utc::now().timestamp();
    if let Err(err) = signature::verify(&header, &raw, &secrets, now, signature::DEFAULT_TOLERANCE) {
        signature_failed(err.kind());
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "bad-signature",
            "The signature does not hold",
            err.to_string(),
        )
        .field(SIGNATURE_HEADER));
    }
    let event = parse(&raw)?;
    let outcome = record(&state, &event, &raw).await.map_err(Problem::unavailable)?;
    Ok((
        StatusCode::OK,
        axum::Json(serde_json::json!({ "id": event.id, "outcome": outcome })),
    )
        .into_response())
}

/// The event, read strictly (a member named twice is refused).
fn parse(raw: &[u8]) -> Result<WebhookEvent, Problem> {
    let object = crate::json::parse_object(raw)
        .map_err(|e| Problem::bad_request("malformed-event", format!("the event is not valid: {e:?}")))?;
    serde_path_to_error::deserialize(serde_json::Value::Object(object))
        .map_err(|e| Problem::bad_request("malformed-event", format!("the event's {}: {}", e.path(), e.inner())))
}

/// Applies `event` and stores it under its id, in one transaction; a
/// repeat (its id already stored) changes nothing. Returns the outcome.
async fn record(state: &AppState, event: &WebhookEvent, raw: &[u8]) -> anyhow::Result<&'static str> {
    let mut tx = super::begin(state).await?;
    let payout = payouts::by_provider_key(&mut tx, &event.data.idempotency_key).await?;
    let span = event_span(&mut tx, event, payout).await?;
    let outcome = apply(state, tx, event, raw, payout).instrument(span.clone()).await?;
    span.record("outcome", outcome);
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

/// Applies the event to `payout` and stores it, committing `tx`.
async fn apply(
    state: &AppState,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    event: &WebhookEvent,
    raw: &[u8],
    payout: Option<i64>,
) -> anyhow::Result<&'static str> {
    let key = &event.data.idempotency_key;
    let outcome = match payout {
        None => "unknown_payout",
        Some(id) if !payouts::payment_matches(&mut tx, id, &event.data, Source::Webhook, Some(&event.id)).await? => {
            Applied::Conflict.as_str()
        }
        Some(id) => payouts::apply_word(&mut tx, id, &word(event), Source::Webhook, Some(&event.id))
            .await?
            .as_str(),
    };
    let body: serde_json::Value = serde_json::from_slice(raw)?;
    let stored = sqlx::query(
        "INSERT INTO settlement.provider_events (id, type, created, provider_key, payout_id, outcome, body)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&event.id) // $1
    .bind(event.r#type.as_str()) // $2
    .bind(event.created) // $3
    .bind(key) // $4
    .bind(payout) // $5
    .bind(outcome) // $6
    .bind(body) // $7
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if stored == 0 {
        tx.rollback().await?;
        return Ok("duplicate");
    }
    super::commit(state, tx).await?;
    if outcome == Applied::Conflict.as_str() || outcome == "unknown_payout" {
        tracing::warn!(event = %event.id, key = %key, outcome, "a provider event needs review");
    }
    Ok(outcome)
}

/// What the event says, as the payout state machine's word.
fn word(event: &WebhookEvent) -> ProviderWord {
    match event.r#type {
        EventType::PaymentPaid => ProviderWord::Paid {
            provider_id: event.data.id.clone(),
        },
        EventType::PaymentFailed => match word_of(&event.data) {
            failed @ ProviderWord::Failed { .. } => failed,
            _ => ProviderWord::Failed {
                provider_id: Some(event.data.id.clone()),
                reason: "the provider's event says failed".into(),
            },
        },
    }
}
