//! Every route the server answers and who may call it: the one table that
//! the router's authorization (`super::auth::authorize`), the OpenAPI
//! document's security requirements, docs/api.md's table of roles and the
//! role matrix test are all read from. A route missing here is refused
//! (500), and a test fails.

use crate::tokens::Role;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: the probes, `/metrics`, `/openapi.json`.
    Open,
    /// Whoever signs the body with the webhook secret (the provider).
    Signed,
    /// A token of this role or above.
    Role(Role),
}

impl Access {
    /// For the docs: `open`, `signed`, or the role.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Access::Open => "open",
            Access::Signed => "webhook signature",
            Access::Role(role) => role.as_str(),
        }
    }
}

/// A route: its method, its path as the router spells it, who may call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The path template (`/v1/payouts/{id}`).
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

const fn route(method: &'static str, path: &'static str, access: Access) -> Route {
    Route { method, path, access }
}

use Access::{Open, Signed};
const VIEWER: Access = Access::Role(Role::Viewer);
const APP: Access = Access::Role(Role::App);
const OPERATOR: Access = Access::Role(Role::Operator);

/// Every route, the API's then the dashboard's.
pub const ROUTES: &[Route] = &[
    route("GET", "/healthz", Open),
    route("GET", "/readyz", Open),
    route("GET", "/metrics", Open),
    route("GET", "/openapi.json", Open),
    route("POST", "/v1/payouts", APP),
    route("GET", "/v1/payouts/{id}", VIEWER),
    route("POST", "/v1/payouts/{id}/confirm", APP),
    route("POST", "/v1/payouts/{id}/cancel", APP),
    route("POST", "/v1/provider-events", Signed),
    route("GET", "/v1/creators/{address}", VIEWER),
    route("GET", "/v1/creators/{address}/statement", VIEWER),
    route("POST", "/v1/holds", APP),
    route("POST", "/v1/holds/{id}/release", APP),
    route("GET", "/v1/queues", VIEWER),
    route("GET", "/v1/queues/{name}", VIEWER),
    route("GET", "/v1/queues/{name}/dead", VIEWER),
    route("POST", "/v1/queues/{name}/pause", OPERATOR),
    route("POST", "/v1/queues/{name}/resume", OPERATOR),
    route("POST", "/v1/queues/{name}/replay", OPERATOR),
    route("POST", "/v1/queues/{name}/cancel", OPERATOR),
    route("GET", "/", VIEWER),
    route("GET", "/runs/{id}", VIEWER),
    route("GET", "/workers", VIEWER),
    route("GET", "/items", VIEWER),
    route("GET", "/locks", VIEWER),
    route("GET", "/payouts", VIEWER),
    route("GET", "/payouts/{id}", VIEWER),
    route("POST", "/dashboard/payouts/{id}/cancel", APP),
    route("GET", "/chain", VIEWER),
    route("GET", "/holds", VIEWER),
    route("POST", "/dashboard/holds", APP),
    route("POST", "/dashboard/holds/{id}/release", APP),
    route("GET", "/creators", VIEWER),
    route("GET", "/creators/{address}", VIEWER),
    route("POST", "/dashboard/retry", OPERATOR),
    route("GET", "/queues", VIEWER),
    route("GET", "/queues/{name}", VIEWER),
    route("GET", "/queues/{name}/jobs/{key}", VIEWER),
    route("POST", "/dashboard/queues/{name}/replay", OPERATOR),
    route("POST", "/dashboard/queues/{name}/pause", OPERATOR),
    route("POST", "/dashboard/queues/{name}/resume", OPERATOR),
    // Who did what is an operator's to read.
    route("GET", "/audit", OPERATOR),
];

/// Who may call `method` on `path` (a router template); None: not a route.
pub(crate) fn access(method: &str, path: &str) -> Option<Access> {
    ROUTES
        .iter()
        .find(|r| r.path == path && r.method.eq_ignore_ascii_case(method))
        .map(|r| r.access)
}

/// docs/api.md's table of routes and roles, as this table writes it.
pub fn markdown() -> String {
    let mut out = String::from("| method | route | needs |\n|---|---|---|\n");
    for r in ROUTES {
        out.push_str(&format!("| {} | `{}` | {} |\n", r.method, r.path, r.access.as_str()));
    }
    out
}
