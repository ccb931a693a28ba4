//! `POST /v1/payouts`: the key claimed, the creator debited, the payout and
//! its delivery job recorded and the answer stored under the key, in one
//! transaction.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use settled_engine::once::idempotency::{self, Begin};
use settled_engine::once::token::OnceToken;
use sqlx::PgConnection;
use tracing::field::Empty;
use tracing::Instrument;

use super::request::{idempotency_key, traceparent, validate};
use super::{one, MadePayout, Payout, PayoutRequest, PAYOUTS_SCOPE};
use crate::address::CreatorAddress;
use crate::api::openapi::{IdempotencyKeyHeader, EXAMPLE_CREATOR, TAG_PAYOUTS};
use crate::api::problem::json_response;
use crate::api::{read_json, AppState, Authorized, Problem, ProblemType};
use crate::money::Amount;
use crate::payouts::{self, CONFIRMATION_PURPOSE};
use anyhow::Context;

/// `POST /v1/payouts`.
#[utoipa::path(post, path = "/v1/payouts", operation_id = "create_payout", tag = TAG_PAYOUTS,
    summary = "Withdraw from a creator's balance, exactly once per Idempotency-Key",
    params(
        ("Idempotency-Key" = IdempotencyKeyHeader, Header, example = "example-payout-1",
         description = "an sf-string (\"abc\") or the bare token (abc), the same key either way; at most 255 characters"),
        ("traceparent" = Option<String>, Header,
         description = "W3C trace context the payout's delivery continues (a malformed one is ignored)"),
    ),
    request_body(content = PayoutRequest, examples(
        ("awaiting confirmation" = (value = json!({ "creator": EXAMPLE_CREATOR, "amount": "1", "confirm": true }))),
        ("queued at once" = (value = json!({ "creator": EXAMPLE_CREATOR, "amount": "1" }))),
    )),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "the payout (a repeat with the same key and body returns it again, with `Idempotent-Replayed: true`)", body = MadePayout),
        (status = 400, description = "malformed body (a field named twice: duplicate-field, naming it), or a missing, repeated or invalid Idempotency-Key"),
        (status = 404, description = "unknown creator (unknown-creator)"),
        (status = 409, description = "insufficient funds (insufficient-funds, with `balance`), an active hold on the creator (creator-on-hold, with `hold`), or a request with this key is still in progress (request-in-progress)"),
        (status = 422, description = "invalid field (invalid-field, naming it), or the key belongs to a different request (idempotency-key-reused)"),
    ))]
pub(crate) async fn create(
    State(state): State<AppState>,
    _: Authorized,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (state, headers) = (&state, &headers);
    let key = idempotency_key(headers)?;
    let (request, _) = read_json::<PayoutRequest>(headers, body).await?;
    let (creator, amount) = validate(&request)?;
    // The fingerprint is of the validated request, so formatting does not matter.
    let canonical = format!(
        "{{\"amount\":\"{amount}\",\"confirm\":{},\"creator\":\"{creator}\"}}",
        request.confirm
    );
    let made = Making {
        creator: &creator,
        amount,
        confirm: request.confirm,
        traceparent: traceparent(headers),
    };
    let fingerprint = idempotency::fingerprint("POST", "/v1/payouts", canonical.as_bytes());
    let begun = idempotency::begin(&state.pool, PAYOUTS_SCOPE, &key, &fingerprint, &state.idempotency)
        .await
        .map_err(Problem::unavailable)?;
    match begun {
        Begin::Replay { status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let content_type = if status.is_success() {
                "application/json"
            } else {
                "application/problem+json"
            };
            let mut response = json_response(status, content_type, &body);
            response
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(response)
        }
        Begin::InProgress => Err(Problem::new(
            StatusCode::CONFLICT,
            ProblemType::RequestInProgress,
            "A request with this Idempotency-Key is in progress",
            "the first request with this key has not finished; retry later to get its response",
        )),
        Begin::Mismatch => Err(key_reused(
            "this Idempotency-Key belongs to a different request, whose answer is kept; use a new key for a new request",
        )),
        Begin::New => match pay(state, &key, &fingerprint, &made).await {
            Ok(answer) => {
                let content_type = if answer.status.is_success() {
                    "application/json"
                } else {
                    "application/problem+json"
                };
                let mut response = json_response(answer.status, content_type, &answer.body);
                if answer.replayed {
                    response
                        .headers_mut()
                        .insert("idempotent-replayed", HeaderValue::from_static("true"));
                }
                Ok(response)
            }
            Err(err) => {
                // Unless the payout committed (its key is then completed and
                // stays), forget the key so a retry runs again.
                let _ = idempotency::abandon(&state.pool, PAYOUTS_SCOPE, &key).await;
                Err(Problem::unavailable(err))
            }
        },
    }
}

/// The final answer to a payout request.
struct Answer {
    status: StatusCode,
    body: serde_json::Value,
    /// The payout was made by an earlier request with this key.
    replayed: bool,
}

/// 422 `idempotency-key-reused`.
fn key_reused(detail: impl Into<String>) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        ProblemType::IdempotencyKeyReused,
        "Idempotency-Key reused with a different request",
        detail,
    )
    .field("Idempotency-Key")
}

/// The payout transaction: conditional debit, payout row, stored response.
/// A refusal (unknown creator, insufficient funds, a hold) is a final answer
/// too, stored under the key like a success.
///
/// The key's payout outlives the key: a key used again after its retention
/// (its stored response pruned) finds the payout it made and answers it.
/// A different request finds it too and gets 422, and its claim is given
/// back rather than answered under the key: the key stays the payout's
/// request's, whose repeats keep getting the payout. Never a second
/// payout, never an endless 503.
async fn pay(state: &AppState, key: &str, fingerprint: &str, made: &Making<'_>) -> anyhow::Result<Answer> {
    let mut tx = crate::api::begin(state).await?;
    let earlier: Option<EarlierPayout> = sqlx::query_as(
        "SELECT id, creator, amount::text AS amount, status, reason, provider_id, expires_at, created_at,
                updated_at, request_hash
         FROM settlement.payouts WHERE idempotency_key = $1",
    )
    .bind(key) // $1
    .fetch_optional(&mut *tx)
    .await?;
    let (status, body, replayed) = match earlier {
        Some(earlier) if earlier.request_hash == fingerprint => {
            (StatusCode::CREATED, serde_json::to_value(&earlier.payout)?, true)
        }
        Some(earlier) => {
            tx.rollback().await?;
            idempotency::abandon(&state.pool, PAYOUTS_SCOPE, key).await?;
            let problem = key_reused(format!(
                "this Idempotency-Key made payout {} for a different request; use a new key for a new request",
                earlier.payout.id
            ));
            let (status, body) = (problem.status, problem.body());
            return Ok(Answer {
                status,
                body,
                replayed: false,
            });
        }
        None => match debit(&mut tx, state, key, fingerprint, made).await? {
            Ok(payout) => {
                crate::api::audit::set_target(format!("payout {} creator {}", payout.payout.id, made.creator));
                (StatusCode::CREATED, serde_json::to_value(&payout)?, false)
            }
            Err(problem) => {
                crate::api::audit::set_target(format!("creator {}", made.creator));
                crate::api::audit::set_outcome(format!(
                    "refused {} (answer kept under the key)",
                    problem.status.as_u16()
                ));
                (problem.status, problem.body(), false)
            }
        },
    };
    idempotency::finish(&mut tx, PAYOUTS_SCOPE, key, status.as_u16(), &body).await?;
    crate::api::commit(state, tx).await?;
    Ok(Answer { status, body, replayed })
}

/// A payout found by its idempotency key, with the fingerprint of the
/// request that made it.
#[derive(sqlx::FromRow)]
struct EarlierPayout {
    #[sqlx(flatten)]
    payout: Payout,
    request_hash: String,
}

/// What `settlement.debit_for_payout` answered.
#[derive(sqlx::FromRow)]
struct Debit {
    outcome: String,
    payout_id: Option<i64>,
    payout_status: Option<String>,
    balance_before: Option<String>,
    active_hold: Option<i64>,
}

/// A payout to make: who, how much, whether it waits for a confirmation,
/// and the trace context its request came with.
struct Making<'a> {
    creator: &'a CreatorAddress,
    amount: Amount,
    confirm: bool,
    traceparent: Option<String>,
}

/// Debits the creator, records the payout and (unless it waits for a
/// confirmation) its delivery job through `settlement.debit_for_payout`,
/// the one place a payout changes a balance (the API's role may not update
/// balances itself), or says why not: an unknown creator, an active hold
/// (read after the balance row is locked, so a hold either committed before
/// and is seen, or waits for this payout), insufficient funds. A payout to
/// confirm gets a one-time token in the same transaction.
///
/// The delivery continues the trace stored with the payout: this debit's
/// `queue.enqueue` span when traces are exported, else the `traceparent`
/// the request came with.
async fn debit(
    tx: &mut PgConnection,
    state: &AppState,
    key: &str,
    fingerprint: &str,
    made: &Making<'_>,
) -> anyhow::Result<Result<MadePayout, Problem>> {
    let (creator, amount) = (made.creator, made.amount);
    let token = if made.confirm {
        Some(OnceToken::issue_in(&mut *tx, CONFIRMATION_PURPOSE, key, state.confirm_ttl).await?)
    } else {
        None
    };
    let span = tracing::info_span!(
        "queue.enqueue",
        otel.kind = "producer",
        queue = payouts::DELIVERY_QUEUE,
        payout.id = Empty,
        payout.status = Empty,
        outcome = Empty,
    );
    let traceparent = span
        .in_scope(crate::telemetry::current_traceparent)
        .or_else(|| made.traceparent.clone());
    let debit: Debit = sqlx::query_as(
        "SELECT outcome, payout_id, payout_status, balance_before::text AS balance_before, active_hold
         FROM settlement.debit_for_payout($1, $2::numeric, $3, $4, $5,
                                          CASE WHEN $5 IS NULL THEN NULL ELSE now() + $6 * interval '1 second' END, $7)",
    )
    .bind(creator.as_str()) // $1
    .bind(amount.to_string()) // $2
    .bind(key) // $3
    .bind(fingerprint) // $4
    .bind(token) // $5
    .bind(state.confirm_ttl.as_secs() as i64) // $6
    .bind(traceparent) // $7
    .fetch_one(&mut *tx)
    .instrument(span.clone())
    .await?;
    // The function says `paid` for a debit made (the payout row exists); a
    // trace reader would take that for the payout's state.
    span.record(
        "outcome",
        match debit.outcome.as_str() {
            "paid" => "debited",
            other => other,
        },
    );
    span.record("payout.id", debit.payout_id);
    span.record("payout.status", debit.payout_status.as_deref());
    let balance = debit.balance_before.unwrap_or_default();
    Ok(match (debit.outcome.as_str(), debit.payout_id) {
        ("paid", Some(id)) => Ok(MadePayout {
            payout: one(&mut *tx, id).await?.context("the payout just made")?,
            confirm_token: token,
        }),
        ("unknown_creator", ..) => Err(Problem::not_found(
            ProblemType::UnknownCreator,
            format!("creator {creator} has no balance"),
        )
        .field("creator")),
        ("on_hold", ..) => {
            let hold = debit.active_hold.unwrap_or_default();
            Err(Problem::new(
                StatusCode::CONFLICT,
                ProblemType::CreatorOnHold,
                "The creator is on hold",
                format!("creator {creator} has active hold {hold}; nothing is paid out until it is released"),
            )
            .field("creator")
            .hold(hold)
            .available("0"))
        }
        ("insufficient_funds", ..) => Err(Problem::new(
            StatusCode::CONFLICT,
            ProblemType::InsufficientFunds,
            "Insufficient funds",
            format!("creator {creator} has a balance of {balance}, less than the {amount} requested"),
        )
        .field("amount")
        .available(balance.clone())
        .balance(balance)),
        (outcome, ..) => anyhow::bail!("settlement.debit_for_payout answered {outcome:?} without its payout"),
    })
}
