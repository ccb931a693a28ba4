//! `GET /openapi.json`: the API's OpenAPI 3.1 document, derived from the
//! code. Each operation is the `#[utoipa::path]` beside its handler; each
//! schema is the type a handler reads or serializes (`ToSchema`); the paths
//! are those `super::api_routes` serves, the one list of routes. This file
//! adds only what holds for every route, once: an error answer is
//! problem+json (`super::Problem`), a 503 carries `Retry-After`, the
//! answers the HTTP layers give any route (421, 503; 400, 408, 413, 415 and
//! 422 to a route that reads a body; 401 to one that needs the token), and
//! the links from a payout made to the operations on it. Never: a schema or
//! a path written here by hand.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{OpenApi, PartialSchema, ToSchema};

use super::problem::{json_response, ProblemBody};
use super::AppState;
use crate::address::CreatorAddress;
use crate::money::Amount;

/// Tag of the payout operations.
pub(crate) const TAG_PAYOUTS: &str = "payouts";
/// Tag of the creator and hold operations.
pub(crate) const TAG_CREATORS: &str = "creators";
/// Tag of the continuous queues' operations.
pub(crate) const TAG_QUEUES: &str = "queues";
/// Tag of the provider's webhooks.
pub(crate) const TAG_PROVIDER: &str = "provider";
/// Tag of health, metrics and this document.
pub(crate) const TAG_SERVER: &str = "server";

/// The example creator of payouts: creator 64 of `settled seed` (default
/// seed), the one the docs' sessions pay, so a tool that sends the
/// document's examples to a seeded database reaches a real balance.
pub const EXAMPLE_CREATOR: &str = "0x08453dd433f2499c722f3b8973bfd99a17093840";
/// The example creator of holds: creator 1 of `settled seed` (default
/// seed), another than the payouts' so that the examples' holds do not
/// refuse the examples' payouts.
pub(crate) const EXAMPLE_HELD_CREATOR: &str = "0x1140e4ea9e0e8e4b21c0de5c4bb8997990c3e972";

/// The document's fixed parts; the operations come from the routes.
#[derive(OpenApi)]
#[openapi(
    info(title = "settled API"),
    components(schemas(ProblemBody, QueueName, IdempotencyKeyHeader)),
    tags(
        (name = "payouts", description = "withdrawals that never pay twice"),
        (name = "creators", description = "balances, ledger entries and holds"),
        (name = "queues", description = "continuous queues for operators"),
        (name = "provider", description = "the payment provider's signed webhooks"),
        (name = "server", description = "health, readiness, metrics and this document"),
    )
)]
pub(crate) struct ApiDoc;

const INTRODUCTION: &str = "Withdrawals that never pay twice, holds, creators, continuous queues. Amounts are decimal strings of token base units (they exceed 2^53). Errors are application/problem+json (RFC 9457) with a stable `type` (the Problem schema lists every one). Bodies are application/json objects that name each field once. Idempotency-Key (IETF draft-ietf-httpapi-idempotency-key-header) is an sf-string, quoted or bare; this server keeps a key and its response for {hours} h (then prunes them), and a payout for ever. A key belongs to the request that used it first while any trace of that request is kept (its stored response, even past the retention, until pruned; the payout it made, for ever): another request with it gets 422 idempotency-key-reused, and a repeat of the request, however late, gets its answer or, once the answer is pruned, the payout it made; never a second payout. A key whose request was refused is free once its response is pruned.";

const WRONG_HOST: &str = "the Host header names a host this server does not serve (unknown-host)";
const UNAVAILABLE: &str = "retry: the database failed or a lock or statement took longer than the API waits (database-busy), or the request took longer than the server's request timeout (request-timeout)";
const UNAVAILABLE_WRITE: &str = "retry: the database failed or a lock or statement took longer than the API waits (database-busy), and the request had no effect; or the answer to its COMMIT was lost (outcome-unknown), or the request took longer than the server's request timeout (request-timeout), and it may or may not have taken effect: retrying is safe (a payout with the same Idempotency-Key answers its outcome; a repeated hold or release answers 409 if the first took effect)";
/// What the HTTP layers answer to a route that reads a JSON body.
const BODY_ANSWERS: [(&str, &str); 5] = [
    (
        "400",
        "malformed body (malformed-json; a field named twice: duplicate-field, naming it)",
    ),
    (
        "408",
        "the body did not arrive in time (body-timeout); the connection is closed and nothing was done",
    ),
    ("413", "body too large (body-too-large)"),
    (
        "415",
        "the body is not sent as application/json (unsupported-media-type)",
    ),
    ("422", "invalid field (invalid-field, naming it)"),
];
const UNAUTHORIZED: &str = "missing, unknown or revoked token (unauthorized)";
const FORBIDDEN: &str = "the token's role is below the one this operation needs, `x-settled-role` (forbidden)";
/// The probes answer any Host (orchestrators send the address they dialled).
const ANY_HOST: [&str; 2] = ["/healthz", "/readyz"];

/// The document, with this server's idempotency-key retention.
pub fn document(retention_hours: u64) -> Value {
    let spec = super::api_routes().into_openapi();
    let mut doc = serde_json::to_value(spec).expect("an OpenAPI document is plain JSON");
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    doc["info"]["description"] = json!(INTRODUCTION.replace("{hours}", &retention_hours.to_string()));
    doc["servers"] = json!([{ "url": "/" }]);
    doc["components"]["securitySchemes"] = json!({
        "bearer": { "type": "http", "scheme": "bearer" },
        "basic": { "type": "http", "scheme": "basic", "description": "any user name; the token as the password" },
    });
    if let Some(Value::Object(paths)) = doc.get_mut("paths") {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else { continue };
            for (method, operation) in item.iter_mut() {
                let Some(operation) = operation.as_object_mut() else {
                    continue;
                };
                let writes = method != "get";
                set_security(method, path, operation);
                add_common_answers(path, writes, operation);
            }
        }
    }
    link_operations(&mut doc);
    doc
}

/// The operation's security requirement and role, from the one table of
/// routes ([`super::routes::ROUTES`]): a bearer token (or HTTP Basic, whose
/// password is the token) of the role `x-settled-role` names, or none.
fn set_security(method: &str, path: &str, operation: &mut Map<String, Value>) {
    use super::routes::{access, Access};
    match access(method, path) {
        Some(Access::Role(role)) => {
            operation.insert("security".into(), json!([{ "bearer": [] }, { "basic": [] }]));
            operation.insert("x-settled-role".into(), json!(role.as_str()));
        }
        Some(Access::Open | Access::Signed) | None => {
            operation.insert("security".into(), json!([]));
        }
    }
}

/// The answers every route may give, and problem+json for every error.
fn add_common_answers(path: &str, writes: bool, operation: &mut Map<String, Value>) {
    let mut common: Vec<(&str, &str)> = vec![("503", if writes { UNAVAILABLE_WRITE } else { UNAVAILABLE })];
    if !ANY_HOST.contains(&path) {
        common.push(("421", WRONG_HOST));
    }
    if operation.contains_key("requestBody") {
        common.extend(BODY_ANSWERS);
    }
    if operation.contains_key("x-settled-role") {
        common.push(("401", UNAUTHORIZED));
        common.push(("403", FORBIDDEN));
    }
    let responses = operation
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("responses are an object");
    for (status, description) in common {
        responses
            .entry(status)
            .or_insert_with(|| json!({ "description": description }));
    }
    for (status, answer) in responses.iter_mut() {
        if status.starts_with('4') || status.starts_with('5') {
            answer["content"] = json!({
                "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } }
            });
        }
        if status == "503" {
            answer["headers"] = json!({ "Retry-After": {
                "description": "seconds to wait before retrying",
                "schema": { "type": "integer", "minimum": 0 }
            } });
        }
    }
}

/// Links from a payout just made to reading, confirming and cancelling it,
/// and from a hold placed to its release, so a client (or a test
/// generator) can follow one payout or hold through.
fn link_operations(doc: &mut Value) {
    let placed = &mut doc["paths"]["/v1/holds"]["post"]["responses"]["201"];
    if placed.is_object() {
        placed["links"] = json!({ "ReleaseHold": {
            "operationId": "release_hold",
            "parameters": { "id": "$response.body#/id" },
            "description": "release the hold just placed"
        } });
    }
    let made = &mut doc["paths"]["/v1/payouts"]["post"]["responses"]["201"];
    if !made.is_object() {
        return;
    }
    made["links"] = json!({
        "GetPayout": {
            "operationId": "get_payout",
            "parameters": { "id": "$response.body#/id" },
            "description": "the payout just made"
        },
        "ConfirmPayout": {
            "operationId": "confirm_payout",
            "parameters": { "id": "$response.body#/id" },
            "requestBody": { "token": "$response.body#/confirm_token" },
            "description": "confirm it with the token its creation answered (made with \"confirm\": true)"
        },
        "CancelPayout": {
            "operationId": "cancel_payout",
            "parameters": { "id": "$response.body#/id" },
            "description": "cancel it while it awaits its confirmation"
        }
    });
}

/// `GET /openapi.json`.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = TAG_SERVER,
    summary = "This document (OpenAPI 3.1)",
    responses((status = 200, description = "the OpenAPI document", body = Object)))]
pub(crate) async fn serve(State(state): State<AppState>) -> Response {
    let hours = state.idempotency.retention.as_secs() / 3600;
    json_response(axum::http::StatusCode::OK, "application/json", &document(hours)).into_response()
}

/// `0x` and 40 hex digits, in one case (mixed case must be a valid
/// EIP-55 checksum, which a pattern cannot say).
pub(crate) const ADDRESS_PATTERN: &str = "^0x([0-9a-f]{40}|[0-9A-F]{40})$";

impl PartialSchema for CreatorAddress {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(ADDRESS_PATTERN))
            .description(Some(
                "0x + 40 hex digits. Mixed case is also accepted when it is a valid EIP-55 checksum.",
            ))
            .into()
    }
}

impl ToSchema for CreatorAddress {
    fn name() -> std::borrow::Cow<'static, str> {
        "Address".into()
    }
}

/// A positive amount of at most 77 significant digits (78-digit values up
/// to 2^256 - 1 are accepted too, which a pattern cannot say).
pub(crate) const AMOUNT_PATTERN: &str = "^0*[1-9][0-9]{0,76}$";

impl PartialSchema for Amount {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(AMOUNT_PATTERN))
            .description(Some(
                "Token base units, a decimal integer from 1 to 2^256 - 1 (a string: amounts exceed 2^53).",
            ))
            .examples(["1"])
            .into()
    }
}

impl ToSchema for Amount {}

/// The `name` of a continuous queue in a path: a plain SQL identifier, as
/// the engine registers queues.
pub(crate) struct QueueName;

impl PartialSchema for QueueName {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[a-z_][a-z0-9_]*$"))
            .max_length(Some(63))
            .into()
    }
}

impl ToSchema for QueueName {}

/// The `Idempotency-Key` header: an sf-string (`"abc"`) or the bare token
/// (`abc`), the same key either way, of visible ASCII.
pub(crate) struct IdempotencyKeyHeader;

impl PartialSchema for IdempotencyKeyHeader {
    fn schema() -> RefOr<Schema> {
        let max = settled_engine::once::idempotency::MAX_IDEMPOTENCY_KEY_CHARS;
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .max_length(Some(max))
                    .pattern(Some(r"^[!#-\[\]-~]([ !#-\[\]-~]*[!#-\[\]-~])?$")),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(3))
                    .max_length(Some(max + 2))
                    .pattern(Some(r#"^"([ !#-\[\]-~]|\\["\\])+"$"#)),
            )
            .into()
    }
}

impl ToSchema for IdempotencyKeyHeader {
    fn name() -> std::borrow::Cow<'static, str> {
        "IdempotencyKey".into()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use axum::body::Body;
    use axum::http::{header, Method, Request, StatusCode};
    use axum::Router;

    use super::*;
    use crate::api::problem::ProblemType;
    use crate::payouts::PayoutState;

    /// The served router, over a pool that never connects (no handler runs:
    /// every probe is answered by the router itself).
    fn served() -> Router {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("a lazy pool");
        crate::api::router(AppState::new(pool.clone(), pool))
    }

    /// The path templates of a router's routes. axum lists them only in
    /// its Debug form (`paths: {RouteId(0): "/healthz", ...}` of its path
    /// router, before its fallback router's).
    fn route_paths<S>(router: &Router<S>) -> BTreeSet<String> {
        let listing = format!("{router:?}");
        let start = listing
            .find("path_router")
            .expect("a router's Debug names its path router");
        let end = listing.find("fallback_router").unwrap_or(listing.len());
        listing[start..end]
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|quoted| quoted.starts_with('/') && !quoted.contains("__private__"))
            .map(str::to_string)
            .collect()
    }

    /// The methods the router serves at `template` (GET's HEAD aside), from
    /// the `Allow` header of its 405 to a method no route takes; None when
    /// no route matches the path.
    async fn methods_at(app: &Router, template: &str) -> Option<BTreeSet<String>> {
        let path: String = template
            .split('/')
            .map(|part| if part.starts_with('{') { "1" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        let probe = Request::builder()
            .method(Method::from_bytes(b"PROBE").expect("a method name"))
            .uri(&path)
            .header(header::HOST, "localhost")
            .body(Body::empty())
            .expect("a request");
        let answer = tower_service::Service::call(&mut app.clone(), probe)
            .await
            .expect("the router answers");
        match answer.status() {
            StatusCode::NOT_FOUND => None,
            StatusCode::METHOD_NOT_ALLOWED => {
                let allow = answer.headers().get(header::ALLOW).expect("a 405 says what is allowed");
                let allow = allow.to_str().expect("ASCII");
                Some(
                    allow
                        .split(',')
                        .map(|m| m.trim().to_ascii_lowercase())
                        .filter(|m| m != "head" || !allow.contains("GET"))
                        .collect(),
                )
            }
            other => panic!("{path}: a method no route takes was answered {other}"),
        }
    }

    /// Each path of the document with its methods.
    fn documented(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
        let paths = doc["paths"].as_object().expect("the document has paths");
        paths
            .iter()
            .map(|(path, item)| {
                let item = item.as_object().expect("a path item");
                (path.clone(), item.keys().cloned().collect())
            })
            .collect()
    }

    #[tokio::test]
    async fn every_served_route_is_in_the_openapi_document_and_every_documented_route_is_served() {
        let app = served();
        let pages = route_paths(&crate::api::dashboard_routes());
        let mut serving = BTreeMap::new();
        for path in route_paths(&app).difference(&pages) {
            let methods = methods_at(&app, path).await.unwrap_or_default();
            serving.insert(path.clone(), methods);
        }
        let documented = documented(&document(24));
        let mut differences = Vec::new();
        for (path, methods) in &documented {
            let served = serving.get(path).cloned().unwrap_or_default();
            for method in methods.difference(&served) {
                differences.push(format!("documented, not served: {} {path}", method.to_uppercase()));
            }
        }
        for (path, methods) in &serving {
            let listed = documented.get(path).cloned().unwrap_or_default();
            for method in methods.difference(&listed) {
                differences.push(format!("served, not documented: {} {path}", method.to_uppercase()));
            }
        }
        assert!(differences.is_empty(), "{}", differences.join("\n"));
        for wanted in [
            "/v1/payouts/{id}/confirm",
            "/v1/payouts/{id}/cancel",
            "/v1/provider-events",
        ] {
            assert!(serving.contains_key(wanted), "{wanted} is served and documented");
        }
    }

    /// Every `$ref` under `value`.
    fn references(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(members) => {
                if let Some(Value::String(target)) = members.get("$ref") {
                    found.push(target.clone());
                }
                members.values().for_each(|member| references(member, found));
            }
            Value::Array(items) => items.iter().for_each(|item| references(item, found)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_in_the_document_resolves() {
        let doc = document(24);
        let mut found = Vec::new();
        references(&doc, &mut found);
        assert!(found.len() > 20, "the document refers to its schemas: {found:?}");
        let dangling: BTreeSet<&String> = found
            .iter()
            .filter(|target| {
                let pointer = target.strip_prefix('#').unwrap_or("not a local reference");
                doc.pointer(pointer).is_none()
            })
            .collect();
        assert!(dangling.is_empty(), "references to nothing: {dangling:?}");
    }

    #[test]
    fn the_document_lists_every_payout_state_and_every_problem_type_from_their_enums() {
        let doc = document(24);
        let schemas = &doc["components"]["schemas"];
        let states: Vec<&str> = PayoutState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            schemas["PayoutState"]["enum"],
            json!(states),
            "{}",
            schemas["PayoutState"]
        );
        assert_eq!(
            schemas["Payout"]["properties"]["status"]["$ref"],
            "#/components/schemas/PayoutState"
        );
        let types: Vec<String> = ProblemType::ALL.iter().map(|t| t.uri()).collect();
        assert_eq!(
            schemas["ProblemType"]["enum"],
            json!(types),
            "{}",
            schemas["ProblemType"]
        );
        let problem = &schemas["Problem"]["properties"];
        assert_eq!(
            problem["status"]["type"], "integer",
            "RFC 9457: status is the HTTP status"
        );
        assert_eq!(problem["payout_status"]["$ref"], "#/components/schemas/PayoutState");
    }
}
