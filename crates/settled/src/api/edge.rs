//! What every response passes through: the request's span (when traces
//! are exported), the Host check, security headers, and problem+json for
//! the errors that axum, tower-http and hyper make on their own (extractor
//! rejections, 404/405, 413, request timeouts).

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::{AppState, Problem, ProblemType};

/// Headers set on every response that does not set its own.
pub(crate) const SECURITY_HEADERS: [(&str, &str); 5] = [
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    // Pages are server-rendered with inline styles and inline SVG; nothing
    // else loads, nothing frames them, forms post only back here.
    (
        "content-security-policy",
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("cross-origin-resource-policy", "same-origin"),
];

/// Which `Host` headers the server answers (DNS rebinding: a page on
/// another site that resolves its own name to 127.0.0.1 sends its own name
/// as the Host).
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    /// Host names or addresses, lower case, without ports. Empty: any.
    hosts: Vec<String>,
}

impl AllowedHosts {
    /// Any host (a server bound to all interfaces with no `--allowed-host`).
    pub(crate) fn any() -> AllowedHosts {
        AllowedHosts { hosts: Vec::new() }
    }

    /// The hosts given, or, when none is given and the server listens on a
    /// loopback address, the names of loopback. None: any host is answered.
    pub(crate) fn for_bind(bind: std::net::SocketAddr, given: &[String]) -> AllowedHosts {
        let mut hosts: Vec<String> = given.iter().map(|h| strip_port(&h.to_ascii_lowercase())).collect();
        if hosts.is_empty() && bind.ip().is_loopback() {
            hosts = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
            hosts.push(bind.ip().to_string());
        } else if !hosts.is_empty() && !bind.ip().is_unspecified() {
            hosts.push(bind.ip().to_string());
        }
        AllowedHosts { hosts }
    }

    /// True when every host is answered.
    pub(crate) fn is_any(&self) -> bool {
        self.hosts.is_empty()
    }

    fn allows(&self, host: &str) -> bool {
        self.is_any() || self.hosts.iter().any(|h| *h == strip_port(&host.to_ascii_lowercase()))
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` without the port and brackets.
fn strip_port(host: &str) -> String {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest).to_string();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name.to_string(),
        _ => host.to_string(),
    }
}

/// Refuses requests whose `Host` is not allowed (421), except the health
/// probes, which orchestrators send with whatever address they dialled.
pub(crate) async fn check_host(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if state.allowed_hosts.is_any() || path == "/healthz" || path == "/readyz" {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match host {
        Some(host) if state.allowed_hosts.allows(host) => next.run(request).await,
        Some(_) => Problem::new(
            StatusCode::MISDIRECTED_REQUEST,
            ProblemType::UnknownHost,
            "Host not served here",
            "the Host header names a host this server does not serve (see --allowed-host)",
        )
        .field("Host")
        .into_response(),
        None => Problem::bad_request(ProblemType::MissingHost, "the Host header is required")
            .field("Host")
            .into_response(),
    }
}

/// Turns an error response that is not problem+json (made by axum's
/// extractors, the router's 404/405, the body limit or the timeout layer)
/// into one, keeping its status and headers and its text as the detail.
pub(crate) async fn problem_for_bare_errors(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let (kind, title, detail) = match status {
        StatusCode::NOT_FOUND => (
            ProblemType::NoSuchRoute,
            "Not found",
            "no such endpoint; see /openapi.json".to_string(),
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            ProblemType::MethodNotAllowed,
            "Method not allowed",
            format!(
                "this endpoint does not take this method (allowed: {})",
                parts
                    .headers
                    .get(header::ALLOW)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
            ),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            ProblemType::BodyTooLarge,
            "Request body too large",
            format!("the body must be at most {} bytes", super::MAX_BODY_BYTES),
        ),
        StatusCode::REQUEST_TIMEOUT | StatusCode::SERVICE_UNAVAILABLE if text.is_empty() => {
            (
                ProblemType::RequestTimeout,
                "The request took too long",
                "the request was stopped; it may or may not have taken effect: retry it with the same Idempotency-Key to learn its outcome".to_string(),
            )
        }
        s if s.is_client_error() => (ProblemType::BadRequest, "Bad request", text),
        _ => (ProblemType::ServerError, "Server error", text),
    };
    let problem = Problem::new(status, kind, title, detail);
    let mut fresh = problem.into_response();
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            fresh.headers_mut().insert(name.clone(), value.clone());
        }
    }
    fresh
}

/// The request's `http.request` server span (named `METHOD /route`, with
/// the route's template, never its values), a child of the request's W3C
/// `traceparent` when it sends one; no span when traces are off.
pub(crate) async fn request_span(request: Request, next: Next) -> Response {
    if !crate::telemetry::enabled() {
        return next.run(request).await;
    }
    let method = request.method().as_str().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let name = match &route {
        Some(route) => format!("{method} {route}"),
        None => method.clone(),
    };
    let span = tracing::info_span!(
        "http.request",
        otel.name = name.as_str(),
        otel.kind = "server",
        http.request.method = method.as_str(),
        http.route = route.as_deref(),
        url.path = request.uri().path(),
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if let Some(traceparent) = request.headers().get("traceparent").and_then(|v| v.to_str().ok()) {
        crate::telemetry::continue_from(&span, traceparent.trim());
    }
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    if response.status().is_server_error() {
        span.record("otel.status_code", "error");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_compared_without_ports_or_case() {
        let bind: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let allowed = AllowedHosts::for_bind(bind, &[]);
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "127.0.0.1",
        ] {
            assert!(allowed.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil",
        ] {
            assert!(!allowed.allows(bad), "{bad}");
        }
        let any = AllowedHosts::for_bind("0.0.0.0:8080".parse().unwrap(), &[]);
        assert!(any.is_any());
        let given = AllowedHosts::for_bind("0.0.0.0:8080".parse().unwrap(), &["Pay.Example:443".to_string()]);
        assert!(given.allows("pay.example"));
        assert!(!given.allows("other.example"));
    }
}
