//! Errors as `application/problem+json` (RFC 9457) with a stable `type`:
//! one [`ProblemType`] per kind, so the OpenAPI document lists every `type`
//! the server can answer, and typed extra members, so a member's name and
//! type are the document's too (never `status`, which is RFC 9457's HTTP
//! status).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;

use crate::payouts::PayoutState;

/// SQLSTATE of a `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE of a `statement_timeout` (or a cancel).
const QUERY_CANCELED: &str = "57014";
/// What an `outcome-unknown` answer tells the client.
pub(crate) const OUTCOME_UNKNOWN_DETAIL: &str = "the database's answer to COMMIT was lost: the request may or may not have taken effect. Retrying is safe: a payout retried with the same Idempotency-Key answers its outcome and never pays twice; a repeated hold answers 409 hold-exists, a repeated release 409 hold-already-released, if the first took effect; a repeated retry of a failed item does nothing more";
/// Seconds a 503 asks the client to wait.
pub(crate) const RETRY_AFTER_SECS: &str = "1";
/// Where every problem `type` starts.
pub(crate) const PROBLEM_TYPE_PREFIX: &str = "/problems/";

/// Declares [`ProblemType`]: each kind once, with its last path segment.
macro_rules! problem_types {
    ($($(#[doc = $doc:literal])+ $variant:ident = $kind:literal,)+) => {
        /// The stable kind of a problem: its `type` is `/problems/<kind>`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum ProblemType {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl ProblemType {
            /// Every kind the server answers.
            pub(crate) const ALL: &'static [ProblemType] = &[$(ProblemType::$variant,)+];

            /// The kind, the last segment of `type` (`insufficient-funds`).
            pub(crate) fn kind(self) -> &'static str {
                match self {
                    $(ProblemType::$variant => $kind,)+
                }
            }
        }
    };
}

problem_types! {
    /// The body is not JSON, or not a valid request.
    MalformedJson = "malformed-json",
    /// The form is not a valid request.
    MalformedForm = "malformed-form",
    /// The body names a member more than once.
    DuplicateField = "duplicate-field",
    /// The body is not sent with the content type the route takes.
    UnsupportedMediaType = "unsupported-media-type",
    /// The body is larger than the server reads.
    BodyTooLarge = "body-too-large",
    /// The body did not arrive in time.
    BodyTimeout = "body-timeout",
    /// A field's value is invalid (named in `field`).
    InvalidField = "invalid-field",
    /// An id in the path is not an integer.
    InvalidId = "invalid-id",
    /// An address in the path is not an address.
    InvalidAddress = "invalid-address",
    /// A `limit` query parameter out of range.
    InvalidLimit = "invalid-limit",
    /// A request the HTTP layers refused (an extractor's rejection).
    BadRequest = "bad-request",
    /// No route at this path.
    NoSuchRoute = "no-such-route",
    /// The route does not take this method.
    MethodNotAllowed = "method-not-allowed",
    /// The Host header names a host this server does not serve.
    UnknownHost = "unknown-host",
    /// No Host header.
    MissingHost = "missing-host",
    /// A missing or wrong bearer token.
    Unauthorized = "unauthorized",
    /// The token's role is below the one the route needs (named in the detail).
    Forbidden = "forbidden",
    /// A dashboard form posted from another site.
    CrossOriginForm = "cross-origin-form",
    /// The request took longer than the server's request timeout.
    RequestTimeout = "request-timeout",
    /// An error of the server.
    ServerError = "server-error",
    /// The database failed; the request had no effect.
    DatabaseUnavailable = "database-unavailable",
    /// A lock or statement took longer than the API waits; no effect.
    DatabaseBusy = "database-busy",
    /// The answer to COMMIT was lost: the request may have taken effect.
    OutcomeUnknown = "outcome-unknown",
    /// The database lacks migrations.
    NotMigrated = "not-migrated",
    /// The database takes no writes.
    ReadOnly = "read-only",
    /// A payout request without an Idempotency-Key.
    MissingIdempotencyKey = "missing-idempotency-key",
    /// An Idempotency-Key that is not a valid key.
    InvalidIdempotencyKey = "invalid-idempotency-key",
    /// The key belongs to a different request.
    IdempotencyKeyReused = "idempotency-key-reused",
    /// The first request with this key has not finished.
    RequestInProgress = "request-in-progress",
    /// No such creator.
    UnknownCreator = "unknown-creator",
    /// The balance is less than the amount (`balance` says how much it is).
    InsufficientFunds = "insufficient-funds",
    /// The creator has an active hold (`hold` names it).
    CreatorOnHold = "creator-on-hold",
    /// No such payout.
    UnknownPayout = "unknown-payout",
    /// The payout is not awaiting confirmation (`payout_status` says where it is).
    PayoutNotAwaitingConfirmation = "payout-not-awaiting-confirmation",
    /// Only a payout awaiting confirmation can be cancelled (`payout_status` says where it is).
    PayoutNotCancellable = "payout-not-cancellable",
    /// The confirmation token expired.
    ConfirmationExpired = "confirmation-expired",
    /// The token is not the payout's, or was used.
    TokenRefused = "token-refused",
    /// The creator already has an active hold (`existing_hold_id` names it).
    HoldExists = "hold-exists",
    /// No such hold.
    UnknownHold = "unknown-hold",
    /// The hold was already released.
    HoldAlreadyReleased = "hold-already-released",
    /// No such run.
    UnknownRun = "unknown-run",
    /// No queue of this name is registered.
    UnknownQueue = "unknown-queue",
    /// The queue's table is missing, does not conform or cannot be read.
    QueueUnusable = "queue-unusable",
    /// The queue has no job with this key.
    UnknownJob = "unknown-job",
    /// The job has started or ended.
    JobStarted = "job-started",
    /// No dead letter matches the replay's filter.
    NoDeadLetterMatched = "no-dead-letter-matched",
    /// No webhook secret is configured.
    WebhooksNotConfigured = "webhooks-not-configured",
    /// A webhook without its signature header.
    MissingSignature = "missing-signature",
    /// A webhook whose signature does not hold.
    BadSignature = "bad-signature",
    /// A signed webhook whose event is not valid.
    MalformedEvent = "malformed-event",
}

impl ProblemType {
    /// The problem's `type`: `/problems/<kind>`.
    pub(crate) fn uri(self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.kind())
    }
}

impl Serialize for ProblemType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.uri())
    }
}

impl utoipa::PartialSchema for ProblemType {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("the problem's stable kind, `/problems/<kind>`"))
            .enum_values(Some(ProblemType::ALL.iter().map(|t| t.uri())))
            .into()
    }
}

impl utoipa::ToSchema for ProblemType {}

/// The body of every error answer (`application/problem+json`, RFC 9457):
/// the standard members, then the ones some kinds add.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = Problem)]
pub(crate) struct ProblemBody {
    /// Which problem.
    #[serde(rename = "type")]
    pub r#type: ProblemType,
    /// A short summary of the kind.
    pub title: &'static str,
    /// The HTTP status of the answer.
    #[schema(minimum = 400, maximum = 599)]
    pub status: u16,
    /// What exactly went wrong.
    pub detail: String,
    /// The request member, header or parameter at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub field: Option<String>,
    /// The creator's balance, in base units (`insufficient-funds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub balance: Option<String>,
    /// The available balance the payout was refused against
    /// (`insufficient-funds`, and `creator-on-hold`, where it is 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub available: Option<String>,
    /// The creator's active hold (`creator-on-hold`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub hold: Option<i64>,
    /// The creator's active hold (`hold-exists`), when it is still active.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub existing_hold_id: Option<i64>,
    /// Where the payout is (`payout-not-awaiting-confirmation`,
    /// `payout-not-cancellable`, `creator-on-hold` of a confirmation).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub payout_status: Option<PayoutState>,
}

/// A problem answer.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// Its body: its kind, title, detail and the extra members set
    /// (boxed: a `Result` carrying a problem stays small).
    pub body: Box<ProblemBody>,
}

impl Problem {
    /// A problem.
    pub(crate) fn new(
        status: StatusCode,
        kind: ProblemType,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Problem {
        Problem {
            status,
            body: Box::new(ProblemBody {
                r#type: kind,
                title,
                status: status.as_u16(),
                detail: detail.into(),
                field: None,
                balance: None,
                available: None,
                hold: None,
                existing_hold_id: None,
                payout_status: None,
            }),
        }
    }

    /// Names the field at fault.
    pub(crate) fn field(mut self, field: impl Into<String>) -> Problem {
        self.body.field = Some(field.into());
        self
    }

    /// Says the creator's balance (`insufficient-funds`).
    pub(crate) fn balance(mut self, balance: impl Into<String>) -> Problem {
        self.body.balance = Some(balance.into());
        self
    }

    /// Says the available balance a payout was refused against.
    pub(crate) fn available(mut self, available: impl Into<String>) -> Problem {
        self.body.available = Some(available.into());
        self
    }

    /// Names the creator's active hold (`creator-on-hold`).
    pub(crate) fn hold(mut self, hold: i64) -> Problem {
        self.body.hold = Some(hold);
        self
    }

    /// Names the creator's active hold (`hold-exists`), when known.
    pub(crate) fn existing_hold(mut self, hold: Option<i64>) -> Problem {
        self.body.existing_hold_id = hold;
        self
    }

    /// Says where the payout is.
    pub(crate) fn payout_status(mut self, status: Option<PayoutState>) -> Problem {
        self.body.payout_status = status;
        self
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> serde_json::Value {
        serde_json::to_value(&self.body).expect("a problem body is plain JSON")
    }

    /// 400: the request is malformed.
    pub(crate) fn bad_request(kind: ProblemType, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, kind, "Bad request", detail)
    }

    /// 422: a field's value is invalid.
    pub(crate) fn invalid(field: &str, detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ProblemType::InvalidField,
            "A field is invalid",
            detail,
        )
        .field(field)
    }

    /// 404.
    pub(crate) fn not_found(kind: ProblemType, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, kind, "Not found", detail)
    }

    /// 503 (with `Retry-After`): the database is unreachable or failed, or
    /// a lock or statement took longer than the API's `lock_timeout` or
    /// `statement_timeout` (`database-busy`); either way nothing committed.
    /// Or COMMIT was sent and its answer lost (`outcome-unknown`): the
    /// request may have taken effect, and the answer says so.
    pub(crate) fn unavailable(err: impl Into<anyhow::Error>) -> Problem {
        let err: anyhow::Error = err.into();
        let at_commit = err.chain().any(|e| {
            matches!(
                e.downcast_ref::<settled_engine::EngineError>(),
                Some(settled_engine::EngineError::CommitOutcomeUnknown { .. })
            )
        });
        if at_commit {
            tracing::warn!(error = format!("{err:#}"), "the answer to a COMMIT was lost");
            return Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ProblemType::OutcomeUnknown,
                "The outcome of the request is unknown",
                OUTCOME_UNKNOWN_DETAIL,
            );
        }
        let code = err
            .chain()
            .find_map(|e| e.downcast_ref::<sqlx::Error>())
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code().map(|c| c.into_owned()));
        if matches!(code.as_deref(), Some(LOCK_NOT_AVAILABLE | QUERY_CANCELED)) {
            tracing::info!(error = %err, "request gave up waiting on the database");
            return Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ProblemType::DatabaseBusy,
                "The database is busy with this row",
                "a lock or statement took longer than the API waits; the request had no effect: retry it (with the same Idempotency-Key, if any)",
            );
        }
        tracing::warn!(error = format!("{err:#}"), "request failed on the database");
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ProblemType::DatabaseUnavailable,
            "The database could not complete the request",
            "the request had no effect; retry it (with the same Idempotency-Key, if any)",
        )
    }
}

/// Sends a JSON body with a content type.
pub(crate) fn json_response(status: StatusCode, content_type: &'static str, body: &serde_json::Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = json_response(self.status, "application/problem+json", &self.body());
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            // The rest of a body that did not arrive in time is not read.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static(super::auth::CHALLENGE),
            );
        }
        response
    }
}
