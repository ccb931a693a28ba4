//! Authentication as extractors, which axum runs before the body extractor:
//! a handler that takes [`Authorized`] (the API) or [`DashboardAuthorized`]
//! (the dashboard's forms) runs only for a request whose head carries the
//! configured token, so no body is read for a request without it. Also
//! owns what a configured token may be ([`parse_api_token`]).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{AppState, Problem, ProblemType};

/// Proof that the request carried the API token as `Authorization: Bearer`.
#[derive(Debug, Clone, Copy)]
pub struct Authorized;

impl FromRequestParts<AppState> for Authorized {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Authorized, Problem> {
        check_token(state, bearer(&parts.headers).unwrap_or("")).map(|()| Authorized)
    }
}

/// Proof that a dashboard form was posted from this server's own pages
/// with the API token: as `Authorization: Bearer`, or as the password of
/// HTTP Basic (a browser asks for it on the 401 and sends it with the form).
/// A browser also sends remembered Basic credentials with a form another
/// site posts here, so a request that says it comes from another origin is
/// refused (403) before its credentials count.
#[derive(Debug, Clone, Copy)]
pub struct DashboardAuthorized;

impl FromRequestParts<AppState> for DashboardAuthorized {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<DashboardAuthorized, Response> {
        if let Some(origin) = foreign_origin(&parts.headers) {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                ProblemType::CrossOriginForm,
                "A form from another site",
                format!("the dashboard's forms are accepted only from its own pages, not from {origin}"),
            )
            .into_response());
        }
        let given = bearer(&parts.headers)
            .map(str::to_string)
            .or_else(|| basic_password(&parts.headers));
        check_token(state, given.as_deref().unwrap_or("")).map_err(|problem| {
            let mut response = problem.into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(DASHBOARD_CHALLENGE));
            response
        })?;
        Ok(DashboardAuthorized)
    }
}

/// True when the request carries the API token (for pages that show more
/// to an authorized reader, e.g. the lock view's query text).
pub fn is_authorized(state: &AppState, headers: &HeaderMap) -> bool {
    check_token(state, bearer(headers).unwrap_or("")).is_ok()
}

/// The challenge a 401 of the API carries (RFC 9110 section 11.6.1).
pub const CHALLENGE: &str = "Bearer realm=\"settled\"";

/// The challenge a 401 of the dashboard's forms carries: a browser asks for
/// a user name (any) and a password (the API token).
pub const DASHBOARD_CHALLENGE: &str = "Basic realm=\"settled dashboard\", charset=\"UTF-8\"";

/// The token of `Authorization: Bearer <token>` (the scheme in any case,
/// RFC 9110 section 11.1).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let (scheme, token) = authorization(headers)?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// The password of `Authorization: Basic base64(user:password)` (RFC 7617).
fn basic_password(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let (scheme, credentials) = authorization(headers)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(credentials).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (_user, password) = decoded.split_once(':')?;
    Some(password.to_string())
}

fn authorization(headers: &HeaderMap) -> Option<(&str, &str)> {
    let (scheme, rest) = headers.get(header::AUTHORIZATION)?.to_str().ok()?.split_once(' ')?;
    Some((scheme, rest.trim()))
}

/// The origin a request says it was sent from, when that is not this
/// server: `Sec-Fetch-Site` other than `same-origin` or `none` (a browser
/// sends it with every request), else an `Origin` whose host and port are
/// not the `Host`. Clients that send neither (curl, scripts) are not
/// browsers, and no other site can make them send a request.
fn foreign_origin(headers: &HeaderMap) -> Option<String> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") {
            return Some(text("origin").unwrap_or(site).to_string());
        }
    }
    let origin = text("origin")?;
    let host = text("host").unwrap_or("");
    let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    (!origin_host.eq_ignore_ascii_case(host)).then(|| origin.to_string())
}

/// Checks a token against the configured one.
pub fn check_token(state: &AppState, given: &str) -> Result<(), Problem> {
    let Some(expected) = &state.api_token else {
        return Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            ProblemType::Unauthorized,
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
            ProblemType::Unauthorized,
            "Unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        ))
    }
}

/// The API token as configured (`SETTLED_API_TOKEN` or `--api-token`):
/// one trailing line ending (`\n` or `\r\n`, as a secret file has) is
/// dropped. A token no request could carry is refused, so the server never
/// starts with mutating endpoints that nobody can use: a blank one,
/// whitespace at either end (a header's value is read without it), or any
/// character other than printable ASCII (control characters included).
/// The error never repeats the token.
pub fn parse_api_token(raw: &str) -> Result<Arc<str>, String> {
    let name = "SETTLED_API_TOKEN (--api-token)";
    let token = raw
        .strip_suffix("\r\n")
        .or_else(|| raw.strip_suffix('\n'))
        .unwrap_or(raw);
    if token.trim().is_empty() {
        return Err(format!(
            "{name} is blank; set a token, or unset it to serve with mutating endpoints disabled"
        ));
    }
    if token.trim() != token {
        return Err(format!(
            "{name} starts or ends with whitespace, which no Authorization header can carry; remove it"
        ));
    }
    if let Some(at) = token.chars().position(|c| !(' '..='~').contains(&c)) {
        return Err(format!(
            "{name} has a control or non-ASCII character at position {}; a token is printable ASCII",
            at + 1
        ));
    }
    Ok(token.into())
}

#[cfg(test)]
mod tests {
    use super::parse_api_token;

    #[test]
    fn a_token_loses_one_trailing_line_ending_and_one_no_request_could_carry_is_refused() {
        for (raw, token) in [
            ("s3cret\n", "s3cret"),
            ("s3cret\r\n", "s3cret"),
            ("a b", "a b"),
            ("t", "t"),
        ] {
            assert_eq!(parse_api_token(raw).as_deref(), Ok(token), "{raw:?}");
        }
        for raw in [
            "",
            " ",
            "\n",
            "\r\n",
            "\t",
            " \n",
            "s3cret\n\n",
            " s3cret",
            "s3cret ",
            "s3\x1bcret",
            "s3\ncret",
            "s3cr\u{e9}t",
            "\u{7f}",
        ] {
            let refused = parse_api_token(raw).expect_err(raw);
            assert!(refused.starts_with("SETTLED_API_TOKEN (--api-token) "), "{refused}");
            assert!(!refused.contains('\n'), "one line: {refused}");
        }
    }
}
