//! A metrics recorder that hears one of the engine's histograms and drops
//! every other metric: how the lab reads the product's own timings
//! without changing the product.

use std::sync::Arc;

/// Hands each value of the histogram `name` to `record`.
pub(crate) struct OneHistogram {
    name: &'static str,
    record: Arc<dyn Fn(f64) + Send + Sync>,
}

impl OneHistogram {
    /// Hears the histogram `name` (one of `settled_engine::raw::telemetry`'s).
    pub(crate) fn new(name: &'static str, record: impl Fn(f64) + Send + Sync + 'static) -> OneHistogram {
        OneHistogram {
            name,
            record: Arc::new(record),
        }
    }

    /// Installs it as the process's recorder.
    pub(crate) fn install(self) -> anyhow::Result<()> {
        metrics::set_global_recorder(self).map_err(|_| anyhow::anyhow!("a metrics recorder is already installed"))
    }
}

struct Heard(Arc<dyn Fn(f64) + Send + Sync>);

impl metrics::HistogramFn for Heard {
    fn record(&self, value: f64) {
        (self.0)(value);
    }
}

impl metrics::Recorder for OneHistogram {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        if key.name() == self.name {
            metrics::Histogram::from_arc(Arc::new(Heard(self.record.clone())))
        } else {
            metrics::Histogram::noop()
        }
    }
}
