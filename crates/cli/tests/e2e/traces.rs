//! OpenTelemetry traces, end to end: real `settled serve`, `settled
//! deliver` and `settled worker` processes exporting over OTLP/HTTP to a
//! receiver that decodes the official protobuf messages. A payout's trace
//! runs from its request through the queue and the provider call to its
//! webhook; a batch run exports its start and finish; without an endpoint
//! nothing is exported.

use crate::common;

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::{wait_until, Env, Server, PERIOD};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{json, Value};

const TOKEN: &str = "test-token";
const SECRET: &str = "whsec-test";
/// The client's trace: the payout request's `traceparent`.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// One exported span, with its resource's attributes.
#[derive(Debug, Clone)]
struct Exported {
    resource: HashMap<String, String>,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: HashMap<String, String>,
    /// Linked spans' ids.
    links: Vec<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, every span kept.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Exported>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
        let kept = spans.clone();
        let app = Router::new()
            .route(
                "/v1/traces",
                post(move |headers: HeaderMap, body: Bytes| async move {
                    assert_eq!(
                        headers.get("content-type").map(|v| v.to_str().unwrap()),
                        Some("application/x-protobuf")
                    );
                    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
                    kept.lock().unwrap().extend(exported(request));
                    (StatusCode::OK, [("content-type", "application/x-protobuf")], Vec::new())
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, spans }
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }

    /// Trace `trace` as an indented tree, each span with the command that
    /// exported it and a few of its attributes (printed with --nocapture).
    fn tree(&self, trace: &str) -> String {
        fn walk(spans: &[Exported], parent: &str, depth: usize, out: &mut String) {
            for s in spans.iter().filter(|s| s.parent == parent) {
                let shown: Vec<String> = [
                    "http.response.status_code",
                    "payout.id",
                    "key",
                    "attempt",
                    "outcome",
                    "provider.key",
                    "event.id",
                ]
                .iter()
                .filter_map(|k| s.attributes.get(*k).map(|v| format!("{k}={v}")))
                .collect();
                let command = s.resource.get("settled.command").map_or("?", String::as_str);
                out.push_str(&format!(
                    "{:indent$}{} [{command}] {}\n",
                    "",
                    s.name,
                    shown.join(" "),
                    indent = depth * 2
                ));
                walk(spans, &s.span_id, depth + 1, out);
            }
        }
        let spans: Vec<Exported> = self.spans().into_iter().filter(|s| s.trace_id == trace).collect();
        let roots: std::collections::HashSet<&str> = spans
            .iter()
            .map(|s| s.parent.as_str())
            .filter(|p| !spans.iter().any(|s| s.span_id == *p))
            .collect();
        let mut out = format!("trace {trace}\n");
        for root in roots {
            walk(&spans, root, 1, &mut out);
        }
        out
    }

    /// The one span named `name` in trace `trace`.
    fn one(&self, trace: &str, name: &str) -> Exported {
        let found: Vec<Exported> = self
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == trace && s.name == name)
            .collect();
        assert_eq!(found.len(), 1, "one {name:?} in trace {trace}: {:#?}", self.spans());
        found.into_iter().next().unwrap()
    }
}

fn exported(request: ExportTraceServiceRequest) -> Vec<Exported> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = attributes(&resource_spans.resource.map(|r| r.attributes).unwrap_or_default());
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                out.push(Exported {
                    resource: resource.clone(),
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    links: span.links.iter().map(|l| hex(&l.span_id)).collect(),
                });
            }
        }
    }
    out
}

/// A provider that accepts every payment (pending) and records each
/// call's `traceparent`.
async fn recording_provider() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let recorded = seen.clone();
    let app = Router::new().route(
        "/v1/payments",
        post(move |headers: HeaderMap, body: axum::Json<Value>| async move {
            let traceparent = headers.get("traceparent").map(|v| v.to_str().unwrap().to_string());
            recorded.lock().unwrap().push(traceparent);
            let key = headers.get("idempotency-key").unwrap().to_str().unwrap().to_string();
            let payment = json!({
                "id": "pay_1", "idempotency_key": key, "creator": body["creator"], "amount": body["amount"],
                "status": "pending", "failure_reason": null, "reference": body["reference"]
            });
            (StatusCode::CREATED, axum::Json(payment))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// A settled period (balances to pay out from).
async fn settled_period() -> Env {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "20"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    env
}

/// `settled deliver` paying through `provider`, with `extra` flags.
fn deliver(env: &Env, provider: &str, extra: &[&str]) -> Child {
    let mut flags = vec!["--poll-after-secs", "3600"];
    flags.extend_from_slice(extra);
    env.deliver(provider, &flags)
}

/// SIGTERM, and the exit that flushes the spans.
fn stop(child: &mut Child) {
    common::stop(child);
}

/// A payout of 100 to a creator with the balance, its request carrying
/// `traceparent`; its id.
async fn payout(env: &Env, server: &Server, traceparent: &str) -> i64 {
    let creator: String = env
        .scalar_text("SELECT creator FROM settlement.creator_balance WHERE balance >= 100 ORDER BY creator LIMIT 1")
        .await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payouts", server.base))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "traced-1")
        .header("traceparent", traceparent)
        .json(&json!({ "creator": creator, "amount": "100" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json::<Value>().await.unwrap()["id"].as_i64().unwrap()
}

/// The provider's signed `payment.paid` webhook for payout `id`.
async fn paid_webhook(env: &Env, server: &Server, id: i64) {
    let (key, creator): (String, String) =
        sqlx::query_as("SELECT provider_key, creator FROM settlement.payouts WHERE id = $1")
            .bind(id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    let event = json!({ "id": "ev-1", "type": "payment.paid", "created": 1, "data": {
        "id": "pay_1", "idempotency_key": key, "creator": creator, "amount": "100",
        "status": "paid", "failure_reason": null } });
    let raw = serde_json::to_vec(&event).unwrap();
    let signature = settled::provider::signature::sign(SECRET.as_bytes(), chrono::Utc::now().timestamp(), &raw);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/provider-events", server.base))
        .header("Provider-Signature", signature)
        .header("Content-Type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["outcome"], "applied");
}

async fn status_of(env: &Env, id: i64) -> String {
    env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payouts_trace_runs_from_its_request_through_the_queue_and_the_provider_to_its_webhook() {
    let env = settled_period().await;
    let receiver = Receiver::start().await;
    let (provider, seen) = recording_provider().await;
    let endpoint = receiver.url.as_str();
    let mut server = env
        .serve_with(
            TOKEN,
            &["--provider-webhook-secret", SECRET, "--otlp-endpoint", endpoint],
        )
        .await;
    let mut deliverer = deliver(&env, &provider, &["--otlp-endpoint", endpoint]);
    let id = payout(&env, &server, &format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")).await;
    wait_until(30, "the payout sent", || async { status_of(&env, id).await == "sent" }).await;
    paid_webhook(&env, &server, id).await;
    assert_eq!(status_of(&env, id).await, "paid");
    stop(&mut deliverer);
    stop(&mut server.child);

    let request = receiver.one(TRACE_ID, "POST /v1/payouts");
    let enqueue = receiver.one(TRACE_ID, "queue.enqueue");
    let job = receiver.one(TRACE_ID, "queue.job");
    let handler = receiver.one(TRACE_ID, "queue.handler");
    let call = receiver.one(TRACE_ID, "POST /v1/payments");
    let complete = receiver.one(TRACE_ID, "queue.complete");
    let event = receiver.one(TRACE_ID, "provider.event");
    // The tree: request -> enqueue -> job -> handler -> provider call, and
    // job -> completion; the webhook under the enqueue too.
    assert_eq!(request.parent, CLIENT_SPAN, "the request continues the client's trace");
    assert_eq!(enqueue.parent, request.span_id);
    assert_eq!(job.parent, enqueue.span_id, "the delivery continues the stored trace");
    assert_eq!(handler.parent, job.span_id);
    assert_eq!(call.parent, handler.span_id);
    assert_eq!(complete.parent, job.span_id);
    assert_eq!(event.parent, enqueue.span_id, "the webhook joins the payout's trace");
    println!("{}", receiver.tree(TRACE_ID));
    assert_eq!(
        seen.lock().unwrap().clone(),
        [Some(format!("00-{TRACE_ID}-{}-01", call.span_id))],
        "the provider was sent the call's own span, in the request's trace"
    );

    // Who exported what, and the attributes.
    assert_eq!(request.resource["service.name"], "settled");
    assert_eq!(request.resource["settled.command"], "serve");
    assert_eq!(job.resource["settled.command"], "deliver");
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(request.attributes["http.request.method"], "POST");
    assert_eq!(request.attributes["http.route"], "/v1/payouts");
    assert_eq!(request.attributes["http.response.status_code"], "201");
    assert_eq!(enqueue.kind, SpanKind::Producer as i32);
    assert_eq!(enqueue.attributes["queue"], "payout_delivery");
    assert_eq!(enqueue.attributes["payout.id"], id.to_string());
    assert_eq!(enqueue.attributes["payout.status"], "queued");
    assert_eq!(job.kind, SpanKind::Consumer as i32);
    assert_eq!(job.attributes["queue"], "payout_delivery");
    assert_eq!(job.attributes["key"], id.to_string());
    assert_eq!(job.attributes["attempt"], "1");
    assert!(job.attributes.contains_key("fence"), "{job:?}");
    assert!(job.attributes.contains_key("wait_ms"), "{job:?}");
    assert_eq!(enqueue.attributes["outcome"], "debited");
    assert_eq!(job.attributes["outcome"], "settled");
    assert_eq!(call.kind, SpanKind::Client as i32);
    assert_eq!(call.attributes["http.response.status_code"], "201");
    let provider_key: String = env
        .scalar_text(&format!("SELECT provider_key FROM settlement.payouts WHERE id = {id}"))
        .await;
    assert_eq!(call.attributes["provider.key"], provider_key);
    assert_eq!(event.attributes["payout.id"], id.to_string());
    assert_eq!(event.attributes["event.id"], "ev-1");
    assert_eq!(event.attributes["outcome"], "applied");

    // The claim took jobs of any traces: the job links to it.
    let spans = receiver.spans();
    let claim = spans
        .iter()
        .find(|s| s.name == "queue.claim" && job.links.contains(&s.span_id))
        .unwrap_or_else(|| panic!("the job's claim among {spans:#?}"));
    assert_eq!(claim.attributes["queue"], "payout_delivery");
    assert_eq!(claim.attributes["jobs"], "1");
    assert!(
        spans
            .iter()
            .all(|s| s.name != "queue.claim" || s.attributes.get("jobs").is_some_and(|n| n != "0")),
        "claims that took nothing are not exported"
    );
    // The webhook's own request started a trace of its own: the event links to it.
    let webhook = spans
        .iter()
        .find(|s| s.name == "POST /v1/provider-events")
        .expect("the webhook's request span");
    assert!(event.links.contains(&webhook.span_id), "{event:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_exported_and_the_requests_traceparent_is_passed_on() {
    let env = settled_period().await;
    let receiver = Receiver::start().await;
    let (provider, seen) = recording_provider().await;
    // The signal's own variable names the receiver; the endpoint is empty.
    let traces = format!("{}/v1/traces", receiver.url);
    let port = common::free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut serve = env.cmd(&["serve", "--bind", &bind, "--provider-webhook-secret", SECRET]);
    serve
        .env("SETTLED_API_TOKEN", TOKEN)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces);
    let mut server = common::spawn_server(serve, port, "/healthz").await;
    let mut deliverer = env
        .cmd(&["deliver", "--provider-url", &provider, "--shutdown-grace-ms", "300"])
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let id = payout(&env, &server, &traceparent).await;
    wait_until(30, "the payout sent", || async { status_of(&env, id).await == "sent" }).await;
    paid_webhook(&env, &server, id).await;
    stop(&mut deliverer);
    stop(&mut server.child);
    assert_eq!(
        env.scalar_text(&format!("SELECT traceparent FROM settlement.payouts WHERE id = {id}"))
            .await,
        traceparent,
        "the request's own trace context is stored"
    );
    assert_eq!(
        seen.lock().unwrap().clone(),
        [Some(traceparent)],
        "and passed on to the provider"
    );
    assert!(receiver.spans().is_empty(), "{:#?}", receiver.spans());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_run_exports_its_start_and_finish_in_the_workers_trace() {
    let env = Env::new().await;
    let receiver = Receiver::start().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "20"]);
    env.run_ok(&["--otlp-endpoint", &receiver.url, "worker", "--period", PERIOD]);
    let spans = receiver.spans();
    let named = |name: &str| -> Exported {
        let found: Vec<&Exported> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name}: {spans:#?}");
        found[0].clone()
    };
    let (work, start, finish) = (named("run.work"), named("run.start"), named("run.finish"));
    let run_id = env.scalar_i64("SELECT max(id) FROM settled_engine.runs").await;
    assert_eq!(start.parent, work.span_id);
    assert_eq!(finish.parent, work.span_id);
    assert_eq!(
        (start.trace_id.as_str(), finish.trace_id.as_str()),
        (work.trace_id.as_str(), work.trace_id.as_str())
    );
    assert_eq!(work.resource["settled.command"], "worker");
    assert_eq!(work.attributes["scope"], PERIOD);
    assert_eq!(start.attributes["scope"], PERIOD);
    assert_eq!(start.attributes["run"], run_id.to_string());
    assert_eq!(start.attributes["started"], "true");
    assert_eq!(finish.attributes["run"], run_id.to_string());
    assert_eq!(finish.attributes["finished"], "true");
    assert_eq!(start.attributes["job"], finish.attributes["job"]);
}
