//! `POST /v1/payouts` and `GET /v1/payouts/{id}`: withdrawals that never pay
//! twice. The debit and the payout row are one call of the database's
//! `settlement.debit_for_payout` (the API's role may not change a balance
//! itself), in the same transaction as the stored idempotent response.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use settled_engine::once::idempotency::{self, Begin, MAX_IDEMPOTENCY_KEY_CHARS};

use super::problem::json_response;
use sqlx::PgConnection;

use super::{read_json, AppState, Authorized, Problem};
use crate::address::CreatorAddress;
use crate::money::Amount;

/// Idempotency scope of payouts.
pub const PAYOUTS_SCOPE: &str = "payouts";

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayoutRequest {
    /// The creator, `0x` + 40 hex digits.
    pub creator: String,
    /// Base units as a decimal string (amounts exceed 2^53).
    pub amount: String,
}

/// A payout as the API shows it.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct Payout {
    /// Payout id.
    pub id: i64,
    /// The creator (lower case).
    pub creator: String,
    /// Base units, decimal string.
    pub amount: String,
    /// `completed`.
    pub status: String,
    /// When it was made.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let missing = || {
        Problem::bad_request("missing-idempotency-key", "the Idempotency-Key header is required")
            .field("Idempotency-Key")
    };
    let invalid = |detail: &str| Problem::bad_request("invalid-idempotency-key", detail).field("Idempotency-Key");
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
            "invalid-idempotency-key",
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
    let canonical = format!("{{\"amount\":\"{amount}\",\"creator\":\"{creator}\"}}");
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
            "request-in-progress",
            "A request with this Idempotency-Key is in progress",
            "the first request with this key has not finished; retry later to get its response",
        )),
        Begin::Mismatch => Err(key_reused(
            "this Idempotency-Key belongs to a different request, whose answer is kept; use a new key for a new request",
        )),
        Begin::New => match pay(state, &key, &fingerprint, &creator, amount).await {
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
        "idempotency-key-reused",
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
async fn pay(
    state: &AppState,
    key: &str,
    fingerprint: &str,
    creator: &CreatorAddress,
    amount: Amount,
) -> anyhow::Result<Answer> {
    let mut tx = super::begin(state).await?;
    let earlier: Option<EarlierPayout> = sqlx::query_as(
        "SELECT id, creator, amount::text AS amount, status, created_at, request_hash
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
        None => match debit(&mut tx, key, fingerprint, creator, amount).await? {
            Ok(payout) => (StatusCode::CREATED, serde_json::to_value(&payout)?, false),
            Err(problem) => (problem.status, problem.body(), false),
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
    payout_created_at: Option<chrono::DateTime<chrono::Utc>>,
    balance_before: Option<String>,
    active_hold: Option<i64>,
}

/// Debits the creator and records the payout through
/// `settlement.debit_for_payout`, the one place a payout changes a balance
/// (the API's role may not update balances itself), or says why not: an
/// unknown creator, an active hold (read after the balance row is locked, so
/// a hold either committed before and is seen, or waits for this payout),
/// insufficient funds.
async fn debit(
    tx: &mut PgConnection,
    key: &str,
    fingerprint: &str,
    creator: &CreatorAddress,
    amount: Amount,
) -> anyhow::Result<Result<Payout, Problem>> {
    let debit: Debit = sqlx::query_as(
        "SELECT outcome, payout_id, payout_status, payout_created_at, balance_before::text AS balance_before, active_hold
         FROM settlement.debit_for_payout($1, $2::numeric, $3, $4)",
    )
    .bind(creator.as_str()) // $1
    .bind(amount.to_string()) // $2
    .bind(key) // $3
    .bind(fingerprint) // $4
    .fetch_one(&mut *tx)
    .await?;
    let balance = debit.balance_before.unwrap_or_default();
    Ok(
        match (
            debit.outcome.as_str(),
            debit.payout_id,
            debit.payout_status,
            debit.payout_created_at,
        ) {
            ("paid", Some(id), Some(status), Some(created_at)) => Ok(Payout {
                id,
                creator: creator.to_string(),
                amount: amount.to_string(),
                status,
                created_at,
            }),
            ("unknown_creator", ..) => {
                Err(Problem::not_found("unknown-creator", format!("creator {creator} has no balance")).field("creator"))
            }
            ("on_hold", ..) => {
                let hold = debit.active_hold.unwrap_or_default();
                Err(Problem::new(
                    StatusCode::CONFLICT,
                    "creator-on-hold",
                    "The creator is on hold",
                    format!("creator {creator} has active hold {hold}; nothing is paid out until it is released"),
                )
                .field("creator")
                .extra(serde_json::json!({ "hold": hold })))
            }
            ("insufficient_funds", ..) => Err(Problem::new(
                StatusCode::CONFLICT,
                "insufficient-funds",
                "Insufficient funds",
                format!("creator {creator} has a balance of {balance}, less than the {amount} requested"),
            )
            .field("amount")
            .extra(serde_json::json!({ "balance": balance }))),
            (outcome, ..) => anyhow::bail!("settlement.debit_for_payout answered {outcome:?} without its payout"),
        },
    )
}

/// `GET /v1/payouts/{id}`.
pub async fn show(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, Problem> {
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::bad_request("invalid-id", "payout id must be an integer").field("id"))?;
    let payout: Option<Payout> = sqlx::query_as(
        "SELECT id, creator, amount::text AS amount, status, created_at FROM settlement.payouts WHERE id = $1",
    )
    .bind(id) // $1
    .fetch_optional(&state.reads)
    .await
    .map_err(Problem::unavailable)?;
    let payout = payout.ok_or_else(|| Problem::not_found("unknown-payout", format!("no payout {id}")))?;
    Ok((StatusCode::OK, axum::Json(payout)).into_response())
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
