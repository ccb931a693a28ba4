//! Authentication and roles. [`authorize`] runs on every matched route,
//! before any extractor: it reads who may call the route from the one
//! table ([`super::routes::ROUTES`]), takes the token from the request's
//! head (`Authorization: Bearer`, or the password of HTTP Basic, as a
//! browser sends it), finds its name and role (`SETTLED_API_TOKEN` is the
//! admin token `env`; others are looked up by their digest on every
//! request, so a revocation holds at once on every server) and answers 401
//! (with the challenge) or 403 (naming the role needed) before any body is
//! read. Handlers that act take [`Authorized`] (the API) or
//! [`DashboardAuthorized`] (the dashboard's forms, which also refuse a form
//! posted from another site): the [`Actor`] the check found. It also hands
//! the audit log its refusals and the requests that act (`super::audit`).
//! Also owns what a configured token may be ([`parse_api_token`]).

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::audit;
use super::routes::{self, Access};
use super::{AppState, Problem, ProblemType};
pub(crate) use crate::tokens::{Actor, Role};

/// Checks the caller of every matched route against the route's access
/// (see the module's top); puts the [`Actor`] in the request's extensions.
pub(crate) async fn authorize(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    let method = match request.method().as_str() {
        "HEAD" => "GET",
        other => other,
    }
    .to_string();
    let method = method.as_str();
    let Some(access) = routes::access(method, &path) else {
        if routes::ROUTES.iter().any(|r| r.path == path) {
            // Another method of a route in the table: the router answers 405.
            return next.run(request).await;
        }
        tracing::error!(method, path, "a route missing from the table of routes is refused");
        return Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ProblemType::ServerError,
            "Route without access rule",
            "this route is missing from the server's table of routes and roles",
        )
        .into_response();
    };
    let Access::Role(needed) = access else {
        return next.run(request).await;
    };
    let challenge = if path.starts_with("/v1/") {
        CHALLENGE
    } else {
        DASHBOARD_CHALLENGE
    };
    let mut entry = audit_entry(method, &path, &request);
    let actor = match actor_of(&state, request.headers()).await {
        Ok(Some(actor)) => actor,
        Ok(None) => {
            entry.actor = if carries_token(request.headers()) {
                audit::UNKNOWN_TOKEN
            } else {
                audit::ANONYMOUS
            }
            .to_string();
            entry.outcome = "refused 401".to_string();
            audit::refusal(&state, &entry).await;
            return with_challenge(unauthorized(), challenge);
        }
        Err(problem) => return problem.into_response(),
    };
    entry.actor = actor.name.clone();
    if actor.role < needed {
        entry.outcome = "refused 403".to_string();
        audit::refusal(&state, &entry).await;
        return forbidden(needed, &actor);
    }
    request.extensions_mut().insert(actor);
    if method == "GET" {
        return next.run(request).await;
    }
    audit::around(&state, entry, next.run(request)).await
}

/// 403, naming the role needed and the token's.
fn forbidden(needed: Role, actor: &Actor) -> Response {
    Problem::new(
        StatusCode::FORBIDDEN,
        ProblemType::Forbidden,
        "The token's role is too low",
        format!(
            "this needs the role {needed} or above; token {} has the role {}",
            actor.name, actor.role
        ),
    )
    .into_response()
}

/// The audit row of a request to the route `path` (a template): the action
/// is the method and the template; the target, the path asked for when the
/// template has parameters (a handler may name it better).
fn audit_entry(method: &str, path: &str, request: &Request) -> crate::audit::Entry {
    crate::audit::Entry {
        actor: audit::ANONYMOUS.to_string(),
        action: format!("{method} {path}"),
        target: if path.contains('{') {
            request.uri().path().to_string()
        } else {
            String::new()
        },
        outcome: crate::audit::OK.to_string(),
    }
}

/// Whether the request carries a token at all (known or not).
fn carries_token(headers: &HeaderMap) -> bool {
    bearer(headers).is_some_and(|t| !t.is_empty()) || basic_password(headers).is_some_and(|t| !t.is_empty())
}

fn with_challenge(problem: Problem, challenge: &'static str) -> Response {
    let mut response = problem.into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    response
}

fn unauthorized() -> Problem {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        ProblemType::Unauthorized,
        "Unauthorized",
        "a valid token is required: `Authorization: Bearer <token>`, or the token as the password of HTTP Basic",
    )
}

/// The token the request carries, resolved to its name and role; None when
/// it carries none, or one that is unknown or revoked.
async fn actor_of(state: &AppState, headers: &HeaderMap) -> Result<Option<Actor>, Problem> {
    let given = bearer(headers).map(str::to_string).or_else(|| basic_password(headers));
    let Some(given) = given.filter(|g| !g.is_empty()) else {
        return Ok(None);
    };
    if check_token(state, &given).is_ok() {
        return Ok(Some(Actor {
            name: crate::tokens::ENV_TOKEN_NAME.to_string(),
            role: Role::Admin,
        }));
    }
    crate::tokens::resolve(&state.pool, &given)
        .await
        .map_err(Problem::unavailable)
}

/// The caller of an API route that acts, as [`authorize`] found it.
#[derive(Debug, Clone)]
pub(crate) struct Authorized;

impl FromRequestParts<AppState> for Authorized {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Authorized, Problem> {
        parts
            .extensions
            .get::<Actor>()
            .cloned()
            .map(|_| Authorized)
            .ok_or_else(unauthorized)
    }
}

/// The caller of a dashboard form, as [`authorize`] found it, from this
/// server's own pages. A browser also sends remembered Basic credentials
/// with a form another site posts here, so a request that says it comes
/// from another origin is refused (403) before its credentials count.
#[derive(Debug, Clone)]
pub(crate) struct DashboardAuthorized;

impl FromRequestParts<AppState> for DashboardAuthorized {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<DashboardAuthorized, Response> {
        if let Some(origin) = foreign_origin(&parts.headers) {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                ProblemType::CrossOriginForm,
                "A form from another site",
                format!("the dashboard's forms are accepted only from its own pages, not from {origin}"),
            )
            .into_response());
        }
        match parts.extensions.get::<Actor>() {
            Some(_) => Ok(DashboardAuthorized),
            None => Err(with_challenge(unauthorized(), DASHBOARD_CHALLENGE)),
        }
    }
}

/// The challenge a 401 of the API carries (RFC 9110 section 11.6.1).
pub(crate) const CHALLENGE: &str = "Bearer realm=\"settled\"";

/// The challenge a 401 of the dashboard's forms carries: a browser asks for
/// a user name (any) and a password (the API token).
pub(crate) const DASHBOARD_CHALLENGE: &str = "Basic realm=\"settled dashboard\", charset=\"UTF-8\"";

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
pub(crate) fn check_token(state: &AppState, given: &str) -> Result<(), Problem> {
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
pub(crate) fn parse_api_token(raw: &str) -> Result<Arc<str>, String> {
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
