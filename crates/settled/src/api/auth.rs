//! Authentication as an extractor: a handler that takes [`Authorized`]
//! runs only for a request with `Authorization: Bearer <token>` matching the
//! configured token, and the body is not read before that check.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};

use super::{AppState, Problem};

/// Proof that the request carried the API token.
#[derive(Debug, Clone, Copy)]
pub struct Authorized;

impl FromRequestParts<AppState> for Authorized {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Authorized, Problem> {
        authorize(state, &parts.headers).map(|()| Authorized)
    }
}

/// True when the request carries the API token (for pages that show more
/// to an authorized reader, e.g. the lock view's query text).
pub fn is_authorized(state: &AppState, headers: &HeaderMap) -> bool {
    authorize(state, headers).is_ok()
}

/// The challenge a 401 carries (RFC 9110 section 11.6.1).
pub const CHALLENGE: &str = "Bearer realm=\"settled\"";

/// Requires `Authorization: Bearer <token>` matching the configured token.
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), Problem> {
    // The scheme is case-insensitive (RFC 9110 section 11.1).
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim());
    check_token(state, given)
}

/// Checks a token given another way (the dashboard's form field).
pub fn check_token(state: &AppState, given: &str) -> Result<(), Problem> {
    let Some(expected) = &state.api_token else {
        return Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            "this server has no API token configured (set SETTLED_API_TOKEN); mutating endpoints are disabled",
        ));
    };
    // Compare digests of equal length without stopping at the first
    // difference: the time taken says nothing about the token or its length.
    use sha2::Digest;
    let (a, b) = (
        sha2::Sha256::digest(given.as_bytes()),
        sha2::Sha256::digest(expected.as_bytes()),
    );
    let same = a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if same {
        Ok(())
    } else {
        Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        ))
    }
}
