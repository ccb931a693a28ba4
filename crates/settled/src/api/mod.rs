//! `settled serve`: the HTTP API (payouts, holds, creators, continuous
//! queues, health, OpenAPI).
//!
//! Owns parsing requests at the edge (addresses, amounts, keys) and mapping
//! outcomes to HTTP. Every once-only rule is kept by the database: the
//! conditional debit, the idempotency key's primary key, the partial unique
//! index on active holds. Never: a check in memory, or check-then-write.

pub(crate) mod audit;
pub(crate) mod auth;
pub(crate) mod creators;
pub(crate) mod dashboard;
pub(crate) mod edge;
pub(crate) mod holds;
pub(crate) mod metrics;
pub mod openapi;
pub(crate) mod payouts;
pub(crate) mod problem;
pub mod provider_events;
pub(crate) mod queues;
pub mod routes;
pub mod server;

use std::sync::Arc;
use std::time::Duration;

use crate::json::ObjectError;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use settled_engine::once::idempotency::IdempotencyConfig;
use sqlx::PgPool;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(crate) use auth::Authorized;
pub(crate) use edge::AllowedHosts;
pub(crate) use problem::{Problem, ProblemType};
pub(crate) use server::HttpLimits;

/// Largest request body read, in bytes.
pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024;
/// Time a handler waits for a whole body (at most `MAX_BODY_BYTES`) once
/// it starts reading it, always after the token is checked: a body that
/// trickles gets 408 and its connection is closed, so even a client with
/// the token cannot keep a request in progress (which the connection cap
/// never evicts) for longer.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How often expired idempotency keys are pruned.
pub(crate) const PRUNE_INTERVAL_SECS: u64 = 60;

/// Connections of the pool for dashboard pages and `/v1` reads.
pub(crate) const READ_POOL_CONNECTIONS: u32 = 4;

/// Shared state of the server.
#[derive(Clone)]
pub struct AppState {
    /// The database, for payouts, holds and health.
    pub pool: PgPool,
    /// A small pool of its own for dashboard pages, `/metrics` and `/v1`
    /// reads, so costly pages cannot starve payouts and `/healthz`.
    pub reads: PgPool,
    /// Bearer token required by mutating endpoints (None: they are refused).
    pub api_token: Option<Arc<str>>,
    /// Idempotency key retention and locking.
    pub idempotency: IdempotencyConfig,
    /// Which Host headers are answered.
    pub allowed_hosts: AllowedHosts,
    /// Run verifications, computed at most once per interval and shared.
    pub verifications: Arc<dashboard::Verifications>,
    /// Decimals of the token, for amounts shown to people.
    pub decimals: u32,
    /// Connection and request limits.
    pub limits: HttpLimits,
    /// `synchronous_commit` of payouts and holds (None: the server's).
    pub synchronous_commit: Option<SynchronousCommit>,
    /// How long a payout made with `"confirm": true` waits for its confirmation.
    pub confirm_ttl: std::time::Duration,
    /// The secrets webhooks are signed with (one, or two while rotating);
    /// None: `POST /v1/provider-events` answers 503 so the provider retries.
    pub webhook_secrets: Option<Arc<Vec<Vec<u8>>>>,
    /// The schedule and deadline that `/metrics` judges runs by.
    pub deadlines: Arc<crate::watch::Deadlines>,
    /// The newest finished run's last verification, for `/metrics`.
    pub verification: crate::watch::VerificationSlot,
    /// How often `serve` verifies the newest finished run (None: never).
    pub verify_every: Option<Duration>,
    /// Refusals counted and not yet written to the audit log.
    pub refusals: Arc<audit::Refusals>,
}

impl AppState {
    /// State with the defaults, over one pool (tests and tools).
    pub fn new(pool: PgPool, reads: PgPool) -> AppState {
        AppState {
            pool,
            reads,
            api_token: None,
            idempotency: IdempotencyConfig::default(),
            allowed_hosts: AllowedHosts::any(),
            verifications: Arc::default(),
            decimals: crate::money::DEFAULT_DECIMALS,
            limits: HttpLimits::default(),
            synchronous_commit: None,
            confirm_ttl: std::time::Duration::from_secs(crate::payouts::DEFAULT_CONFIRM_TTL_SECS),
            webhook_secrets: None,
            deadlines: Arc::default(),
            verification: crate::watch::VerificationSlot::default(),
            verify_every: None,
            refusals: Arc::default(),
        }
    }
}

/// The API's routes, each a handler with its `#[utoipa::path]`: the one
/// list that both the server ([`router`]) and `/openapi.json`
/// ([`openapi::document`]) are made from.
pub(crate) fn api_routes() -> OpenApiRouter<AppState> {
    use utoipa::OpenApi;
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(metrics::ready))
        .routes(routes!(metrics::serve))
        .routes(routes!(openapi::serve))
        .routes(routes!(payouts::create))
        .routes(routes!(payouts::show))
        .routes(routes!(payouts::confirm))
        .routes(routes!(payouts::cancel))
        .routes(routes!(provider_events::receive))
        .routes(routes!(creators::show))
        .routes(routes!(creators::statement))
        .routes(routes!(holds::create))
        .routes(routes!(holds::release))
        .routes(routes!(queues::list))
        .routes(routes!(queues::show))
        .routes(routes!(queues::dead))
        .routes(routes!(queues::pause))
        .routes(routes!(queues::resume))
        .routes(routes!(queues::replay))
        .routes(routes!(queues::cancel))
}

/// The dashboard's pages and forms: HTML for people, not part of the API
/// (docs/api.md lists them).
pub(crate) fn dashboard_routes() -> Router<AppState> {
    Router::new()
        .route("/", get(dashboard::runs))
        .route("/runs/{id}", get(dashboard::run_report))
        .route("/workers", get(dashboard::workers))
        .route("/items", get(dashboard::items))
        .route("/locks", get(dashboard::locks))
        .route("/payouts", get(dashboard::payouts))
        .route("/payouts/{id}", get(dashboard::find::payout))
        .route("/dashboard/payouts/{id}/cancel", post(dashboard::find::cancel_payout))
        .route("/chain", get(dashboard::find::chain))
        .route("/holds", get(dashboard::find::holds))
        .route("/dashboard/holds", post(dashboard::find::place_hold))
        .route("/dashboard/holds/{id}/release", post(dashboard::find::release_hold))
        .route("/creators", get(dashboard::find_creator))
        .route("/creators/{address}", get(dashboard::creator))
        .route("/dashboard/retry", post(dashboard::retry))
        .route("/queues", get(dashboard::queues::list))
        .route("/queues/{name}", get(dashboard::queues::show))
        .route("/queues/{name}/jobs/{key}", get(dashboard::queues::job))
        .route("/dashboard/queues/{name}/replay", post(dashboard::queues::replay))
        .route("/dashboard/queues/{name}/pause", post(dashboard::queues::pause))
        .route("/dashboard/queues/{name}/resume", post(dashboard::queues::resume))
        .route("/audit", get(dashboard::audit_page::audit))
}

/// Everything the server serves: the API, the dashboard, and a
/// problem+json 404 for any other path, behind the edge's layers.
pub fn router(state: AppState) -> Router {
    let (api, _) = api_routes().split_for_parts();
    let mut router = dashboard_routes()
        .merge(api)
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorize))
        .fallback(|| async { Problem::not_found(ProblemType::NoSuchRoute, "no such endpoint; see /openapi.json") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), edge::check_host))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            state.limits.request_timeout,
        ))
        .layer(RequestBodyLimitLayer::new(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(edge::problem_for_bare_errors))
        .layer(axum::middleware::from_fn(dashboard::html_errors))
        .layer(axum::middleware::from_fn(edge::request_span))
        .with_state(state);
    for (name, value) in edge::SECURITY_HEADERS {
        router = router.layer(SetResponseHeaderLayer::if_not_present(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        ));
    }
    router
}

/// Serves the API on `listener` until SIGTERM or SIGINT (then drains open
/// connections for at most the grace period); prunes expired idempotency
/// keys and verifies the newest finished run in the background.
pub(crate) async fn serve(listener: tokio::net::TcpListener, state: AppState) -> anyhow::Result<()> {
    metrics::handle();
    let verifier = state.verify_every.map(|every| {
        tokio::spawn(crate::watch::keep_verifying(
            state.reads.clone(),
            every,
            state.verification.clone(),
        ))
    });
    let pool = state.pool.clone();
    let pruner = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(PRUNE_INTERVAL_SECS));
        loop {
            tick.tick().await;
            match settled_engine::once::idempotency::prune(&pool).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(pruned = n, "expired idempotency keys pruned"),
                Err(err) => tracing::warn!(error = %err, "pruning idempotency keys failed"),
            }
        }
    });
    let refusals = tokio::spawn(audit::keep_writing_refusals(state.clone()));
    let limits = state.limits;
    let served = server::run(listener, router(state.clone()), limits, shutdown_signal()).await;
    refusals.abort();
    audit::write_refusals(&state).await;
    pruner.abort();
    if let Some(verifier) = verifier {
        verifier.abort();
    }
    served
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    if let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    }
}

/// What `/healthz` and `/readyz` answer when all is well.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Healthy {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: Health,
}

/// The state a probe reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Health {
    /// The server reaches the database.
    Ok,
    /// It is migrated and takes writes too.
    Ready,
}

/// `GET /healthz`.
#[utoipa::path(get, path = "/healthz", operation_id = "health", tag = openapi::TAG_SERVER,
    summary = "Liveness: 200 once the server can reach the database",
    responses(
        (status = 200, description = "healthy", body = Healthy),
        (status = 503, description = "retry: the database is unreachable (database-unavailable)"),
    ))]
async fn healthz(State(state): State<AppState>) -> Response {
    match sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&state.pool).await {
        Ok(_) => (StatusCode::OK, axum::Json(Healthy { status: Health::Ok })).into_response(),
        Err(err) => Problem::unavailable(err).into_response(),
    }
}

/// Reads an optional count that JSON may write as `3546` or `3546.0` (JSON
/// Schema counts both as integers, so a client generated from the document
/// may send either); a fraction or a negative number is refused.
pub(crate) fn integral<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else {
        return Ok(None);
    };
    if let Some(n) = number.as_u64() {
        return Ok(Some(n));
    }
    match number.as_f64() {
        // Exact below 2^53; any count the API takes is far below.
        Some(f) if f.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&f) => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!(
            "invalid value: {number}, expected a non-negative integer"
        ))),
    }
}

/// `lock_timeout` of the API's transactions: a payout or hold that would
/// wait longer on a row lock answers 503 `database-busy` instead.
pub(crate) const API_LOCK_TIMEOUT: &str = "2s";
/// `statement_timeout` of the API's transactions.
pub(crate) const API_STATEMENT_TIMEOUT: &str = "5s";

/// Begins a write transaction of the API (payouts, holds) with its lock and
/// statement timeouts, the payouts' mover (`api`, for their history; a
/// webhook's word names itself instead) and, when configured, its
/// `synchronous_commit` (so a
/// 201 is sent only once a synchronous standby has the commit). All are
/// transaction-local (`set_config(..., true)`): they end with it, and hold
/// behind a transaction pooler.
pub(crate) async fn begin(state: &AppState) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    let mut tx = state.pool.begin().await?;
    sqlx::query(
        "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true),
                CASE WHEN $3::text IS NULL THEN NULL ELSE set_config('synchronous_commit', $3, true) END,
                set_config('settled.moved_by', $4, true)",
    )
    .bind(API_LOCK_TIMEOUT) // $1
    .bind(API_STATEMENT_TIMEOUT) // $2
    .bind(state.synchronous_commit.map(SynchronousCommit::as_str)) // $3
    .bind(crate::payouts::MOVED_BY_API) // $4
    .execute(&mut *tx)
    .await?;
    Ok(tx)
}

/// Commits an API write transaction, with the audit row of the request in
/// progress (see [`audit`]). With a `synchronous_commit` configured,
/// the statement timeout is lifted first, so that nothing but the standby
/// ends the wait for it: PostgreSQL answers a cancelled wait with a
/// successful COMMIT (and a warning), which would send a 201 for a payout
/// the standby never got. The request timeout still bounds the wait; a
/// payout cut off that way answers 503 ("may or may not have taken
/// effect": the client retries with its key). An error of the COMMIT
/// itself is [`EngineError::CommitOutcomeUnknown`]: answered 503
/// `outcome-unknown`, never "no effect".
///
/// [`EngineError::CommitOutcomeUnknown`]: settled_engine::EngineError::CommitOutcomeUnknown
pub(crate) async fn commit(state: &AppState, mut tx: sqlx::Transaction<'static, sqlx::Postgres>) -> anyhow::Result<()> {
    let recorded = audit::record_in(&mut tx).await?;
    if state.synchronous_commit.is_some() {
        sqlx::query("SELECT set_config('statement_timeout', '0', true)")
            .execute(&mut *tx)
            .await?;
    }
    tx.commit()
        .await
        .map_err(settled_engine::EngineError::at_commit("committing an API write"))?;
    if let Some(recorded) = recorded {
        recorded.committed();
    }
    Ok(())
}

/// `synchronous_commit` of the API's write transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SynchronousCommit {
    /// The local WAL flush only (acknowledged payouts can be lost in an
    /// asynchronous failover).
    Local,
    /// The server's `on`: with `synchronous_standby_names`, the standby has flushed it.
    On,
    /// The standby has written it (not flushed).
    RemoteWrite,
    /// The standby has applied it: visible there, so a failover to it keeps
    /// every acknowledged payout.
    RemoteApply,
}

impl SynchronousCommit {
    /// As PostgreSQL spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SynchronousCommit::Local => "local",
            SynchronousCommit::On => "on",
            SynchronousCommit::RemoteWrite => "remote_write",
            SynchronousCommit::RemoteApply => "remote_apply",
        }
    }
}

/// Reads the body (at most [`MAX_BODY_BYTES`]) of a request whose
/// Content-Type is `application/json` (415 otherwise) and parses it as a
/// JSON object of `T` (an array or a scalar is refused, and so is a member
/// named twice), naming the field at fault.
pub(crate) async fn read_json<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> Result<(T, Bytes), Problem> {
    if !has_media_type(headers, "application/json") {
        return Err(unsupported_media_type(
            "the body must be JSON, sent with `Content-Type: application/json`",
        ));
    }
    let bytes = read_body(body).await?;
    let object = crate::json::parse_object(&bytes).map_err(|e| match e {
        ObjectError::Syntax(e) => Problem::bad_request(
            ProblemType::MalformedJson,
            format!("the body is not a valid request: {e}"),
        ),
        ObjectError::NotAnObject => Problem::bad_request(ProblemType::MalformedJson, "the body must be a JSON object"),
        ObjectError::Duplicate(path) => Problem::bad_request(
            ProblemType::DuplicateField,
            format!("the body names `{path}` more than once; send each field once"),
        )
        .field(path),
    })?;
    if let Some(path) = nul_at(&object) {
        return Err(Problem::invalid(
            &path,
            format!("{path} holds a NUL character, which no text in the database can hold"),
        ));
    }
    let value = serde_path_to_error::deserialize::<_, T>(serde_json::Value::Object(object))
        .map_err(|e| problem_at(e, ProblemType::MalformedJson, "the body"))?;
    Ok((value, bytes))
}

/// A handler's JSON object body, read as [`read_json`] reads it (its last
/// argument: it takes the body).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(request: axum::extract::Request, _: &S) -> Result<JsonBody<T>, Problem> {
        let (parts, body) = request.into_parts();
        let (value, _) = read_json(&parts.headers, body).await?;
        Ok(JsonBody(value))
    }
}

/// The path (`key`, `a.b`, `a[0]`) of the first string in `object`, at any
/// depth, that holds a NUL (U+0000): PostgreSQL's text cannot.
fn nul_at(object: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    fn walk(value: &serde_json::Value, path: String) -> Option<String> {
        match value {
            serde_json::Value::String(text) => text.contains('\0').then_some(path),
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| walk(item, format!("{path}[{i}]"))),
            serde_json::Value::Object(members) => members.iter().find_map(|(key, member)| {
                let inner = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                walk(member, inner)
            }),
            _ => None,
        }
    }
    object.iter().find_map(|(key, member)| walk(member, key.clone()))
}

/// Reads the body (at most [`MAX_BODY_BYTES`]) of a form posted as
/// `application/x-www-form-urlencoded` (415 otherwise) into `T`, naming the
/// field at fault.
pub(crate) async fn read_form<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> Result<T, Problem> {
    if !has_media_type(headers, "application/x-www-form-urlencoded") {
        return Err(unsupported_media_type(
            "the form must be sent with `Content-Type: application/x-www-form-urlencoded`",
        ));
    }
    let bytes = read_body(body).await?;
    let fields = serde_urlencoded::Deserializer::new(form_urlencoded::parse(&bytes));
    serde_path_to_error::deserialize::<_, T>(fields).map_err(|e| problem_at(e, ProblemType::MalformedForm, "the form"))
}

/// Reads at most [`MAX_BODY_BYTES`] of `body` (413 beyond) within
/// [`BODY_READ_TIMEOUT`] (408 after).
async fn read_body(body: Body) -> Result<Bytes, Problem> {
    read_body_within(body, BODY_READ_TIMEOUT).await
}

/// Reads at most [`MAX_BODY_BYTES`] of `body` (413 beyond) within `limit`
/// (408 after).
async fn read_body_within(body: Body, limit: Duration) -> Result<Bytes, Problem> {
    let read = tokio::time::timeout(limit, axum::body::to_bytes(body, MAX_BODY_BYTES));
    let Ok(read) = read.await else {
        return Err(Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            ProblemType::BodyTimeout,
            "The body took too long",
            format!(
                "the whole body must arrive within {} ms once the server reads it; nothing was done",
                limit.as_millis()
            ),
        ));
    };
    read.map_err(|_| {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ProblemType::BodyTooLarge,
            "Request body too large",
            format!("the body must be at most {MAX_BODY_BYTES} bytes"),
        )
    })
}

/// A 400 naming the field a deserializer failed on: the path to a value of
/// the wrong type, or the one serde names for an unknown or missing field
/// ("unknown field `x`").
fn problem_at<E: std::fmt::Display>(e: serde_path_to_error::Error<E>, kind: ProblemType, what: &str) -> Problem {
    let message = e.inner().to_string();
    let path = e.path().to_string();
    let field = if path != "." {
        Some(path)
    } else {
        message.split('`').nth(1).map(str::to_string)
    };
    let problem = Problem::bad_request(kind, format!("{what} is not a valid request: {message}"));
    match field {
        Some(field) => problem.field(field),
        None => problem,
    }
}

/// 415, naming the Content-Type header.
fn unsupported_media_type(detail: &str) -> Problem {
    Problem::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ProblemType::UnsupportedMediaType,
        "Unsupported media type",
        detail,
    )
    .field("Content-Type")
}

/// True when the Content-Type is `wanted`, with or without parameters.
fn has_media_type(headers: &HeaderMap, wanted: &str) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(wanted))
}
