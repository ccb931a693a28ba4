//! `POST /v1/payouts`, its confirmation and cancel, and `GET
//! /v1/payouts/{id}`: withdrawals that never pay twice. The debit, the
//! payout row and its delivery job (the outbox) are one call of the
//! database's `settlement.debit_for_payout` (the API's role may not change a
//! balance itself), in the same transaction as the stored idempotent
//! response. Confirming and cancelling are the database's
//! `settlement.confirm_payout` (which redeems the one-time token and reads
//! holds under the creator's lock) and `settlement.cancel_payout`; the API's
//! role may not move a payout otherwise.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use settled_engine::once::idempotency::{self, Begin, MAX_IDEMPOTENCY_KEY_CHARS};
use utoipa::ToSchema;

use super::problem::json_response;
use sqlx::PgConnection;
use tracing::field::Empty;
use tracing::Instrument;

use super::openapi::{IdempotencyKeyHeader, EXAMPLE_CREATOR, TAG_PAYOUTS};
use super::{read_json, AppState, Authorized, Problem, ProblemType};
use crate::address::CreatorAddress;
use crate::money::Amount;
use crate::payouts::{self, PayoutState, CONFIRMATION_PURPOSE};
use anyhow::Context;
use settled_engine::once::token::{OnceToken, Redemption};

/// Idempotency scope of payouts.
pub const PAYOUTS_SCOPE: &str = "payouts";

/// The request body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PayoutRequest {
    /// The creator, `0x` + 40 hex digits.
    #[schema(value_type = CreatorAddress)]
    pub creator: String,
    /// Base units as a decimal string (amounts exceed 2^53).
    #[schema(value_type = Amount)]
    pub amount: String,
    /// Hold the payout until `POST /v1/payouts/{id}/confirm` redeems the
    /// one-time token this answer carries (it expires otherwise, and its
    /// funds come back).
    #[serde(default)]
    pub confirm: bool,
}

/// A payout as the API shows it.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct Payout {
    /// Payout id.
    #[schema(minimum = 1)]
    pub id: i64,
    /// The creator (lower case).
    pub creator: String,
    /// Base units, decimal string.
    pub amount: String,
    /// Where the payout is.
    pub status: PayoutState,
    /// Why its last transition happened.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// The provider's id, once it accepted the payment.
    #[schema(required = true)]
    pub provider_id: Option<String>,
    /// When an unconfirmed payout expires.
    #[schema(required = true)]
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When it was made.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Its last change.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// The columns of [`Payout`], for its queries.
const PAYOUT_COLUMNS: &str =
    "id, creator, amount::text AS amount, status, reason, provider_id, expires_at, created_at, updated_at";

/// A payout just made: with its one-time confirmation token when asked for.
#[derive(Debug, Serialize, ToSchema)]
pub struct MadePayout {
    /// The payout.
    #[serde(flatten)]
    pub payout: Payout,
    /// The one-time token that confirms it (only when made with
    /// `"confirm": true`, and only in this answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub confirm_token: Option<uuid::Uuid>,
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let missing = || {
        Problem::bad_request(
            ProblemType::MissingIdempotencyKey,
            "the Idempotency-Key header is required",
        )
        .field("Idempotency-Key")
    };
    let invalid =
        |detail: &str| Problem::bad_request(ProblemType::InvalidIdempotencyKey, detail).field("Idempotency-Key");
    let mut all = headers.get_all("idempotency-key").iter();
    let key = all.next().ok_or_else(missing)?;
    if all.next().is_some() {
        return Err(invalid("send exactly one Idempotency-Key header"));
    }
    let key = key
        .to_str()
        .map_err(|_| invalid("Idempotency-Key must be visible ASCII"))?;
    // The draft's form is a structured-field String ("abc"); the bare
    // token form (abc) is accepted too, as the same key.
    let key = sf_string(key.trim()).ok_or_else(|| invalid("Idempotency-Key is not a valid sf-string"))?;
    let key = key.as_str();
    if key.is_empty() {
        return Err(missing());
    }
    if key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
        return Err(Problem::bad_request(
            ProblemType::InvalidIdempotencyKey,
            format!("Idempotency-Key must be at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
        )
        .field("Idempotency-Key"));
    }
    Ok(key.to_string())
}

/// The value of a structured-field String (RFC 8941 section 3.3.3), or the
/// text itself when it is not quoted. None for a malformed quoted string.
fn sf_string(text: &str) -> Option<String> {
    let Some(inner) = text.strip_prefix('"') else {
        return (!text.contains('"') && !text.contains('\\')).then(|| text.to_string());
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return None,
            },
            '"' => return chars.next().is_none().then_some(out),
            c if (' '..='~').contains(&c) => out.push(c),
            _ => return None,
        }
    }
    None
}

/// Validates the request; returns the creator and amount.
pub fn validate(request: &PayoutRequest) -> Result<(CreatorAddress, Amount), Problem> {
    let creator =
        CreatorAddress::parse(&request.creator).map_err(|e| Problem::invalid("creator", format!("creator {e}")))?;
    let amount =
        Amount::parse_decimal(&request.amount).map_err(|e| Problem::invalid("amount", format!("amount {e}")))?;
    if amount == Amount::ZERO {
        return Err(Problem::invalid("amount", "amount must be greater than zero"));
    }
    Ok((creator, amount))
}

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
pub async fn create(
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
    let mut tx = super::begin(state).await?;
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
                super::audit::set_target(format!("payout {} creator {}", payout.payout.id, made.creator));
                (StatusCode::CREATED, serde_json::to_value(&payout)?, false)
            }
            Err(problem) => {
                super::audit::set_target(format!("creator {}", made.creator));
                super::audit::set_outcome(format!(
                    "refused {} (answer kept under the key)",
                    problem.status.as_u16()
                ));
                (problem.status, problem.body(), false)
            }
        },
    };
    idempotency::finish(&mut tx, PAYOUTS_SCOPE, key, status.as_u16(), &body).await?;
    super::commit(state, tx).await?;
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

/// The request's W3C `traceparent`, when it has a well-formed one.
fn traceparent(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?.trim();
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    (parts.len() == 4 && hex(parts[0], 2) && hex(parts[1], 32) && hex(parts[2], 16) && hex(parts[3], 2))
        .then(|| value.to_string())
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

/// Payout `id`, if it exists.
async fn one(conn: &mut PgConnection, id: i64) -> anyhow::Result<Option<Payout>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {PAYOUT_COLUMNS} FROM settlement.payouts WHERE id = $1"
    ))
    .bind(id) // $1
    .fetch_optional(conn)
    .await?)
}

fn payout_id(id: &str) -> Result<i64, Problem> {
    id.parse()
        .map_err(|_| Problem::bad_request(ProblemType::InvalidId, "payout id must be an integer").field("id"))
}

/// A transition of a payout, as `GET /v1/payouts/{id}` lists them.
#[derive(Debug, Serialize, sqlx::FromRow, ToSchema)]
pub struct Transition {
    /// The state it left (none for the first).
    #[schema(required = true)]
    pub from_state: Option<PayoutState>,
    /// The state it entered.
    pub to_state: PayoutState,
    /// Why.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// A payout with its history, oldest transition first.
#[derive(Debug, Serialize, ToSchema)]
pub struct PayoutWithHistory {
    /// The payout.
    #[serde(flatten)]
    pub payout: Payout,
    /// Every transition it made.
    pub history: Vec<Transition>,
}

/// `GET /v1/payouts/{id}`: the payout and its history.
#[utoipa::path(get, path = "/v1/payouts/{id}", operation_id = "get_payout", tag = TAG_PAYOUTS,
    summary = "A payout and its history",
    params(("id" = i64, Path, minimum = 1, description = "the payout's id")),
    responses(
        (status = 200, description = "the payout", body = PayoutWithHistory),
        (status = 400, description = "the id is not an integer (invalid-id)"),
        (status = 404, description = "no such payout (unknown-payout)"),
    ))]
pub async fn show(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, Problem> {
    let id = payout_id(&id)?;
    let mut conn = state.reads.acquire().await.map_err(Problem::unavailable)?;
    let payout = one(&mut conn, id)
        .await
        .map_err(Problem::unavailable)?
        .ok_or_else(|| Problem::not_found(ProblemType::UnknownPayout, format!("no payout {id}")))?;
    let history: Vec<Transition> = sqlx::query_as(
        "SELECT from_state, to_state, reason, at FROM settlement.payout_history WHERE payout_id = $1 ORDER BY id",
    )
    .bind(id) // $1
    .fetch_all(&mut *conn)
    .await
    .map_err(Problem::unavailable)?;
    Ok((StatusCode::OK, axum::Json(PayoutWithHistory { payout, history })).into_response())
}

/// The body of a confirmation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmRequest {
    /// The one-time token the payout's creation answered with.
    #[schema(format = Uuid)]
    pub token: String,
}

/// `POST /v1/payouts/{id}/confirm`: redeems the payout's one-time token and
/// queues the payout for delivery, in one call of
/// `settlement.confirm_payout`. Of racing confirmations (on any number of
/// servers) exactly one succeeds: the payout's row lock, the token's
/// conditional update and the payout's are all the database's. While the
/// creator is on hold the confirmation is refused (409
/// `creator-on-hold`), nothing changes and the token stays usable.
#[utoipa::path(post, path = "/v1/payouts/{id}/confirm", operation_id = "confirm_payout", tag = TAG_PAYOUTS,
    summary = "Confirm a payout made with \"confirm\": true; it is queued for delivery",
    params(("id" = i64, Path, minimum = 1, description = "the payout's id")),
    request_body = ConfirmRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "confirmed: the payout, queued", body = Payout),
        (status = 400, description = "the id is not an integer (invalid-id), or a malformed body"),
        (status = 403, description = "the token is not this payout's, or it was used (token-refused)"),
        (status = 404, description = "no such payout (unknown-payout)"),
        (status = 409, description = "the payout is not awaiting confirmation (payout-not-awaiting-confirmation), or its creator has an active hold (creator-on-hold: the token stays usable); `payout_status` says where the payout is"),
        (status = 410, description = "the token expired (confirmation-expired); the payout expires and its funds come back"),
    ))]
pub async fn confirm(
    State(state): State<AppState>,
    _: Authorized,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let id = payout_id(&id)?;
    let (request, _) = read_json::<ConfirmRequest>(&headers, body).await?;
    let token: uuid::Uuid = request
        .token
        .parse()
        .map_err(|_| Problem::invalid("token", "token must be the UUID the payout's creation answered with"))?;
    let confirmed = confirm_in_tx(&state, id, token).await.map_err(Problem::unavailable)?;
    match confirmed {
        Ok(payout) => Ok((StatusCode::OK, axum::Json(payout)).into_response()),
        Err(problem) => Err(problem),
    }
}

/// What `settlement.confirm_payout` answered.
#[derive(sqlx::FromRow)]
struct Confirmation {
    outcome: String,
    payout_status: Option<PayoutState>,
    active_hold: Option<i64>,
}

async fn confirm_in_tx(state: &AppState, id: i64, token: uuid::Uuid) -> anyhow::Result<Result<Payout, Problem>> {
    let mut tx = super::begin(state).await?;
    let answer: Confirmation =
        sqlx::query_as("SELECT outcome, payout_status, active_hold FROM settlement.confirm_payout($1, $2)")
            .bind(id) // $1
            .bind(token) // $2
            .fetch_one(&mut *tx)
            .await?;
    if answer.outcome != "confirmed" {
        tx.rollback().await?;
        return Ok(Err(not_confirmed(id, &answer)?));
    }
    let payout = one(&mut tx, id).await?.context("the payout just confirmed")?;
    super::commit(state, tx).await?;
    Ok(Ok(payout))
}

/// Why a confirmation did nothing: no such payout, the payout is past
/// confirming, its creator is on hold, the token expired, or the token is
/// not this payout's (or was used): the engine's [`Redemption`] says which.
fn not_confirmed(id: i64, answer: &Confirmation) -> anyhow::Result<Problem> {
    let status = answer.payout_status;
    let shown = status.map_or("unknown", PayoutState::as_str);
    Ok(match answer.outcome.as_str() {
        "unknown_payout" => Problem::not_found(ProblemType::UnknownPayout, format!("no payout {id}")),
        "not_awaiting_confirmation" => Problem::new(
            StatusCode::CONFLICT,
            ProblemType::PayoutNotAwaitingConfirmation,
            "The payout is not awaiting confirmation",
            format!("payout {id} is {shown}"),
        )
        .payout_status(status),
        "on_hold" => {
            let hold = answer.active_hold.unwrap_or_default();
            Problem::new(
                StatusCode::CONFLICT,
                ProblemType::CreatorOnHold,
                "The creator is on hold",
                format!(
                    "the creator of payout {id} has active hold {hold}; the payout stays awaiting confirmation, which may be sent again once the hold is released"
                ),
            )
            .hold(hold)
            .payout_status(status)
        }
        other => match Redemption::parse(other) {
            Some(Redemption::Expired) => Problem::new(
                StatusCode::GONE,
                ProblemType::ConfirmationExpired,
                "The confirmation expired",
                format!("the token of payout {id} expired; the payout expires and its funds come back"),
            ),
            Some(Redemption::Refused) => Problem::new(
                StatusCode::FORBIDDEN,
                ProblemType::TokenRefused,
                "The token does not confirm this payout",
                format!("the token is not payout {id}'s, or it was used"),
            )
            .field("token"),
            _ => anyhow::bail!("settlement.confirm_payout answered {other:?}"),
        },
    })
}

/// `POST /v1/payouts/{id}/cancel`: cancels a payout still awaiting its
/// confirmation through `settlement.cancel_payout`; its funds come back in
/// the same transaction.
#[utoipa::path(post, path = "/v1/payouts/{id}/cancel", operation_id = "cancel_payout", tag = TAG_PAYOUTS,
    summary = "Cancel a payout awaiting its confirmation; its funds come back",
    params(("id" = i64, Path, minimum = 1, description = "the payout's id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "cancelled: the payout", body = Payout),
        (status = 400, description = "the id is not an integer (invalid-id)"),
        (status = 404, description = "no such payout (unknown-payout)"),
        (status = 409, description = "only a payout awaiting confirmation can be cancelled (payout-not-cancellable); `payout_status` says where it is"),
    ))]
pub async fn cancel(State(state): State<AppState>, _: Authorized, Path(id): Path<String>) -> Result<Response, Problem> {
    let id = payout_id(&id)?;
    let payout = cancel_by_id(&state, id).await?;
    Ok((StatusCode::OK, axum::Json(payout)).into_response())
}

/// Cancels payout `id` if it awaits its confirmation (the API's and the
/// dashboard's form): 404 for no such payout, 409 naming its state.
pub(crate) async fn cancel_by_id(state: &AppState, id: i64) -> Result<Payout, Problem> {
    let result: anyhow::Result<Result<Payout, Problem>> = async {
        let mut tx = super::begin(state).await?;
        let (outcome, status): (String, Option<PayoutState>) =
            sqlx::query_as("SELECT outcome, payout_status FROM settlement.cancel_payout($1)")
                .bind(id) // $1
                .fetch_one(&mut *tx)
                .await?;
        if outcome != "cancelled" {
            tx.rollback().await?;
            return Ok(Err(match status {
                None => Problem::not_found(ProblemType::UnknownPayout, format!("no payout {id}")),
                Some(status) => Problem::new(
                    StatusCode::CONFLICT,
                    ProblemType::PayoutNotCancellable,
                    "Only a payout awaiting confirmation can be cancelled",
                    format!("payout {id} is {status}"),
                )
                .payout_status(Some(status)),
            }));
        }
        let payout = one(&mut tx, id).await?.context("the payout just cancelled")?;
        super::commit(state, tx).await?;
        Ok(Ok(payout))
    }
    .await;
    result.map_err(Problem::unavailable)?
}

#[cfg(test)]
mod tests {
    use super::sf_string;

    #[test]
    fn idempotency_keys_read_as_sf_strings_or_bare_tokens() {
        assert_eq!(sf_string("\"abc\"").as_deref(), Some("abc"));
        assert_eq!(sf_string("abc").as_deref(), Some("abc"));
        assert_eq!(sf_string(r#""a\"b\\c""#).as_deref(), Some(r#"a"b\c"#));
        for bad in ["\"abc", "\"a\"b\"", r#""a\x""#, "a\"b", "\"tab\there\""] {
            assert_eq!(sf_string(bad), None, "{bad:?}");
        }
    }
}
