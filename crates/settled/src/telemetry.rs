//! Traces: OpenTelemetry spans exported over OTLP/HTTP (protobuf) when an
//! endpoint is given, and nothing at all otherwise: no layer is installed,
//! every span callsite stays disabled, and no hook runs.
//!
//! Owns the tracer provider (its batch exporter, its flush at exit) and the
//! W3C `traceparent` glue: continuing a stored or received trace context as
//! a span's parent, and the current span's context to store or send. The
//! engine's spans are plain `tracing` spans; it continues a job's stored
//! trace through the [`settled_engine::raw::telemetry::TraceHooks`]
//! installed here. Never exports anything a log line would not say: no
//! secret, no token, no request body.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider, SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The service name when `OTEL_SERVICE_NAME` does not set one.
pub(crate) const SERVICE_NAME: &str = "settled";
/// The resource attribute naming the subcommand a process runs.
pub(crate) const COMMAND_ATTRIBUTE: &str = "settled.command";
/// The OTLP/HTTP path of traces under the endpoint's base URL.
pub(crate) const TRACES_PATH: &str = "/v1/traces";
/// Longest one export may take before it is given up.
pub(crate) const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the exit waits for the last spans to leave.
pub(crate) const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// True once spans are exported: the hooks below do nothing until then.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// True when this process exports spans.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The tracer provider of a process that exports spans; flushes them on
/// [`Traces::shutdown`] (or when dropped).
#[derive(Debug)]
pub(crate) struct Traces {
    provider: SdkTracerProvider,
}

/// The layer that turns `tracing` spans into OpenTelemetry spans.
pub(crate) type Layer<S> = tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>;

impl Traces {
    /// Starts exporting to `endpoint` (an OTLP base URL: traces go to
    /// `<endpoint>/v1/traces`), spans carrying `command` as a resource
    /// attribute. Returns the provider and the layer to install.
    pub(crate) fn start<S>(endpoint: &str, command: &str) -> anyhow::Result<(Traces, Layer<S>)>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let url = traces_url(endpoint)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("the OTLP exporter to {url}"))?;
        let service = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| SERVICE_NAME.to_string());
        let resource = Resource::builder()
            .with_service_name(service)
            .with_attribute(KeyValue::new(COMMAND_ATTRIBUTE, command.to_string()))
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(DropIdleClaims(BatchSpanProcessor::builder(exporter).build()))
            .with_resource(resource)
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("settled"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            // Parents come from the tracing spans themselves: no OpenTelemetry
            // context attached and detached at every poll of a traced future.
            .with_context_activation(false);
        ENABLED.store(true, Ordering::Relaxed);
        settled_engine::raw::telemetry::install_trace_hooks(settled_engine::raw::telemetry::TraceHooks {
            continue_from,
            current: current_traceparent,
        });
        Ok((Traces { provider }, layer))
    }

    /// Exports what is left and stops the exporter.
    pub(crate) fn shutdown(self) {
        if let Err(err) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            eprintln!("warning: exporting the last spans: {err}");
        }
    }
}

/// `<endpoint>/v1/traces`, for an http(s) base URL.
pub(crate) fn traces_url(endpoint: &str) -> anyhow::Result<String> {
    let url = url::Url::parse(endpoint).with_context(|| format!("--otlp-endpoint {endpoint:?} is not a URL"))?;
    anyhow::ensure!(
        url.scheme() == "http" || url.scheme() == "https",
        "--otlp-endpoint {endpoint:?} must be an http:// or https:// base URL (OTLP over HTTP)"
    );
    Ok(format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/')))
}

/// Makes `span` (not yet entered) a child of the W3C `traceparent`; a
/// malformed one leaves it where it was. Does nothing unless spans are exported.
pub(crate) fn continue_from(span: &tracing::Span, traceparent: &str) {
    if !enabled() || span.is_disabled() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Traceparent(traceparent));
    if parent.span().span_context().is_valid() {
        // Only fails for a span already entered: it keeps its parent.
        let _ = span.set_parent(parent);
    }
}

/// The current span's W3C `traceparent` (None unless spans are exported and
/// a span is current).
pub(crate) fn current_traceparent() -> Option<String> {
    if !enabled() {
        return None;
    }
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = Traceparent::default();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.0.take()
}

/// A carrier holding just a `traceparent`.
#[derive(Default)]
struct Traceparent<T = Option<String>>(T);

impl Extractor for Traceparent<&str> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

impl Injector for Traceparent {
    fn set(&mut self, key: &str, value: String) {
        if key == "traceparent" {
            self.0 = Some(value);
        }
    }
}

/// The batch exporter, less the claims that took nothing: an idle worker
/// claims every poll, and those spans say nothing (a claim that took jobs
/// is kept, and its jobs link to it).
#[derive(Debug)]
struct DropIdleClaims(BatchSpanProcessor);

impl DropIdleClaims {
    fn is_idle_claim(span: &SpanData) -> bool {
        span.name == "queue.claim"
            && span
                .attributes
                .iter()
                .all(|kv| kv.key.as_str() != "jobs" || kv.value.as_str() == "0")
    }
}

impl SpanProcessor for DropIdleClaims {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if !DropIdleClaims::is_idle_claim(&span) {
            self.0.on_end(span);
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_a_base_url_and_traces_go_under_it() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert!(traces_url("collector:4318").is_err());
        assert!(traces_url("not a url").is_err());
    }

    #[test]
    fn off_there_is_no_trace_context_to_store_or_send() {
        assert!(!enabled());
        assert_eq!(current_traceparent(), None);
    }
}
