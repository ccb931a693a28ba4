//! Errors as `application/problem+json` (RFC 9457) with a stable `type`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// SQLSTATE of a `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE of a `statement_timeout` (or a cancel).
const QUERY_CANCELED: &str = "57014";
/// What an `outcome-unknown` answer tells the client.
pub const OUTCOME_UNKNOWN_DETAIL: &str = "the database's answer to COMMIT was lost: the request may or may not have taken effect. Retrying is safe: a payout retried with the same Idempotency-Key answers its outcome and never pays twice; a repeated hold answers 409 hold-exists, a repeated release 409 hold-already-released, if the first took effect; a repeated retry of a failed item does nothing more";
/// Seconds a 503 asks the client to wait.
pub const RETRY_AFTER_SECS: &str = "1";

/// A problem answer.
#[derive(Debug, Clone)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable kind, the last part of `type` (e.g. `insufficient-funds`).
    pub kind: &'static str,
    /// Short summary of the kind.
    pub title: &'static str,
    /// What exactly went wrong.
    pub detail: String,
    /// The request field at fault, if any.
    pub field: Option<String>,
    /// Extra members (e.g. the existing hold's id).
    pub extra: Option<serde_json::Value>,
}

impl Problem {
    /// A problem.
    pub fn new(status: StatusCode, kind: &'static str, title: &'static str, detail: impl Into<String>) -> Problem {
        Problem {
            status,
            kind,
            title,
            detail: detail.into(),
            field: None,
            extra: None,
        }
    }

    /// Names the field at fault.
    pub fn field(mut self, field: impl Into<String>) -> Problem {
        self.field = Some(field.into());
        self
    }

    /// Adds members.
    pub fn extra(mut self, extra: serde_json::Value) -> Problem {
        self.extra = Some(extra);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "type": format!("/problems/{}", self.kind),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let Some(field) = &self.field {
            body["field"] = serde_json::Value::from(field.clone());
        }
        if let Some(serde_json::Value::Object(extra)) = &self.extra {
            for (k, v) in extra {
                body[k] = v.clone();
            }
        }
        body
    }

    /// 400: the request is malformed.
    pub fn bad_request(kind: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, kind, "Bad request", detail)
    }

    /// 422: a field's value is invalid.
    pub fn invalid(field: &str, detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-field",
            "A field is invalid",
            detail,
        )
        .field(field)
    }

    /// 404.
    pub fn not_found(kind: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, kind, "Not found", detail)
    }

    /// 503 (with `Retry-After`): the database is unreachable or failed, or
    /// a lock or statement took longer than the API's `lock_timeout` or
    /// `statement_timeout` (`database-busy`); either way nothing committed.
    /// Or COMMIT was sent and its answer lost (`outcome-unknown`): the
    /// request may have taken effect, and the answer says so.
    pub fn unavailable(err: impl Into<anyhow::Error>) -> Problem {
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
                "outcome-unknown",
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
                "database-busy",
                "The database is busy with this row",
                "a lock or statement took longer than the API waits; the request had no effect: retry it (with the same Idempotency-Key, if any)",
            );
        }
        tracing::warn!(error = format!("{err:#}"), "request failed on the database");
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database-unavailable",
            "The database could not complete the request",
            "the request had no effect; retry it (with the same Idempotency-Key, if any)",
        )
    }
}

/// Sends a JSON body with a content type.
pub fn json_response(status: StatusCode, content_type: &'static str, body: &serde_json::Value) -> Response {
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
