//! Prometheus metrics (scraped at `GET /metrics`), kept with the Prometheus project's own
//! client library: requests by outcome, request latency, batch sizes and compute times, queue
//! depth, device memory in use, and batches retried request by request.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Request latency buckets: 50 µs to about 3.3 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(5e-5, 2.0, 17))
}

/// Batch-size buckets: 1 to 1024 rows, doubling.
fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 11))
}

/// The server's metrics, one time series per model (label `model`).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    requests: Family<Labels, Counter>,
    latency: Histograms,
    batch_size: Histograms,
    batch_seconds: Histograms,
    queue_depth: Family<Labels, Gauge>,
    memory: Family<Labels, Gauge>,
    retried: Family<Labels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let requests = Family::<Labels, Counter>::default();
        let latency = Histograms::new_with_constructor(latency_histogram);
        let batch_size = Histograms::new_with_constructor(batch_histogram);
        let batch_seconds = Histograms::new_with_constructor(latency_histogram);
        let queue_depth = Family::<Labels, Gauge>::default();
        let memory = Family::<Labels, Gauge>::default();
        let retried = Family::<Labels, Counter>::default();
        let mut registry = Registry::with_prefix("burn_serve");
        registry.register(
            "requests",
            "Inference requests answered, by model and HTTP status code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its answer",
            latency.clone(),
        );
        registry.register(
            "batch_size",
            "Rows in each batch the model ran",
            batch_size.clone(),
        );
        registry.register(
            "batch_duration_seconds",
            "Time the model took for each batch",
            batch_seconds.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for a batch",
            queue_depth.clone(),
        );
        registry.register(
            "memory_in_use_bytes",
            "Device memory in use after the model's last batch",
            memory.clone(),
        );
        registry.register(
            "batches_retried",
            "Batches that failed and were run again one request at a time",
            retried.clone(),
        );
        Self {
            registry: Arc::new(registry),
            requests,
            latency,
            batch_size,
            batch_seconds,
            queue_depth,
            memory,
            retried,
        }
    }
}

impl Metrics {
    /// The handle a model's batcher and requests record into.
    pub fn model(&self, name: &str) -> ModelMetrics {
        let labels = vec![("model".to_string(), name.to_string())];
        ModelMetrics {
            labels: labels.clone(),
            requests: self.requests.clone(),
            latency: self.latency.get_or_create_owned(&labels),
            batch_size: self.batch_size.get_or_create_owned(&labels),
            batch_seconds: self.batch_seconds.get_or_create_owned(&labels),
            queue_depth: self.queue_depth.get_or_create_owned(&labels),
            memory: self.memory.get_or_create_owned(&labels),
            retried: self.retried.get_or_create_owned(&labels),
        }
    }

    /// The metrics in the OpenMetrics text format, which Prometheus scrapes.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// One model's metrics. The default records into metrics of its own, registered nowhere (a
/// batcher used without a server).
#[derive(Clone, Debug)]
pub struct ModelMetrics {
    labels: Labels,
    requests: Family<Labels, Counter>,
    latency: Histogram,
    batch_size: Histogram,
    batch_seconds: Histogram,
    queue_depth: Gauge,
    memory: Gauge,
    retried: Counter,
}

impl Default for ModelMetrics {
    fn default() -> Self {
        Metrics::default().model("")
    }
}

impl ModelMetrics {
    /// A request answered with `outcome` (the HTTP status code, or why it failed) after
    /// `seconds`.
    pub fn observe_request(&self, outcome: &str, seconds: f64) {
        let mut labels = self.labels.clone();
        labels.push(("code".to_string(), outcome.to_string()));
        self.requests.get_or_create(&labels).inc();
        self.latency.observe(seconds);
    }

    /// A batch of `rows` that took `seconds`.
    pub fn observe_batch(&self, rows: usize, seconds: f64) {
        self.batch_size.observe(rows as f64);
        self.batch_seconds.observe(seconds);
    }

    /// A batch that failed and is run again one request at a time.
    pub fn observe_retry(&self) {
        self.retried.inc();
    }

    /// Requests waiting now.
    pub fn set_queue_depth(&self, requests: usize) {
        self.queue_depth.set(requests as i64);
    }

    /// Device memory in use now.
    pub fn set_memory_in_use(&self, bytes: u64) {
        self.memory.set(bytes.min(i64::MAX as u64) as i64);
    }
}
