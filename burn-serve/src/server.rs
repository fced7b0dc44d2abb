//! The HTTP server: the Open Inference Protocol's endpoints over the batchers, and `/metrics`.
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /v2` | [`ServerMetadata`] |
//! | `GET /v2/health/live`, `GET /v2/health/ready` | 200, or 400 once shutting down (ready) |
//! | `GET /v2/models/{name}[/versions/{v}]` | [`ModelMetadata`] |
//! | `GET /v2/models/{name}[/versions/{v}]/ready` | 200 |
//! | `POST /v2/models/{name}[/versions/{v}]/infer` | [`InferResponse`], or an [`ErrorResponse`] with [`ServeError::status`] |
//! | `GET /metrics` | Prometheus metrics ([`Metrics`]) |

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::metrics::{Metrics, ModelMetrics};
use crate::protocol::{
    ErrorResponse, HEADER_LENGTH, InferRequest, InferResponse, JsonTensor, ModelMetadata,
    ServerMetadata, binary_body, split_body,
};
use crate::{Batcher, BatcherConfig, ModelSpec, Servable, ServeError};

/// Server-wide settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// The name `GET /v2` reports.
    pub name: String,
    /// The largest request body accepted; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// The deadline of a request that sets none (`parameters.timeout`); `None`: no deadline.
    pub request_timeout: Option<Duration>,
    /// Threads that parse requests and write answers (the models run on their own workers).
    pub http_threads: usize,
}

impl Default for ServerConfig {
    /// `burn-serve`, 16 MiB bodies, 10 s deadline, 2 HTTP threads.
    fn default() -> Self {
        Self {
            name: "burn-serve".to_string(),
            max_body_bytes: 16 << 20,
            request_timeout: Some(Duration::from_secs(10)),
            http_threads: 2,
        }
    }
}

struct Model {
    spec: ModelSpec,
    batcher: Batcher,
    metrics: ModelMetrics,
}

struct Shared {
    config: ServerConfig,
    models: HashMap<String, Model>,
    metrics: Metrics,
    ready: AtomicBool,
}

/// A set of models behind the Open Inference Protocol v2 over HTTP/JSON (and binary tensors),
/// so that a client written for Triton or KServe works unchanged: [`add_model`](Self::add_model)
/// puts a model behind a [`Batcher`](crate::Batcher), and [`start`](Self::start) serves them,
/// with Prometheus metrics at `/metrics`. Example: the book's chapter "Serving a model".
pub struct Server {
    shared: Shared,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.shared.config)
            .field("models", &self.shared.models.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Server {
    /// A server with no model yet.
    pub fn new(config: ServerConfig) -> Self {
        Self {
            shared: Shared {
                config,
                models: HashMap::new(),
                metrics: Metrics::default(),
                ready: AtomicBool::new(true),
            },
        }
    }

    /// Serves `spec.name` with one worker per replica, batched as `batching` says.
    pub fn add_model<S: Servable>(
        &mut self,
        spec: ModelSpec,
        batching: BatcherConfig,
        replicas: Vec<S>,
    ) -> Result<&mut Self, ServeError> {
        if self.shared.models.contains_key(&spec.name) {
            return Err(ServeError::invalid(
                "model",
                format!("'{}' is served already", spec.name),
            ));
        }
        if spec.input.shape.first() != Some(&-1) || spec.output.shape.first() != Some(&-1) {
            return Err(ServeError::invalid(
                "model",
                "the input's and output's first dimension must be the batch (-1)",
            ));
        }
        let metrics = self.shared.metrics.model(&spec.name);
        let batcher = Batcher::with_metrics(batching, replicas, metrics.clone())?;
        self.shared.models.insert(
            spec.name.clone(),
            Model {
                spec,
                batcher,
                metrics,
            },
        );
        Ok(self)
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Serves on `listener` until `shutdown` completes, then shuts down gracefully: stops
    /// accepting connections, answers the requests already received, and drains the batchers.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let shared = Arc::new(self.shared);
        let router = router(Arc::clone(&shared));
        let signal = {
            let shared = Arc::clone(&shared);
            async move {
                shutdown.await;
                shared.ready.store(false, Ordering::SeqCst);
                tracing::info!("shutting down: finishing the requests received");
            }
        };
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(signal)
            .await
            .map_err(|error| ServeError::Io(error.to_string()));
        let drain = Arc::clone(&shared);
        tokio::task::spawn_blocking(move || {
            for model in drain.models.values() {
                model.batcher.shutdown();
            }
        })
        .await
        .map_err(|error| ServeError::Io(error.to_string()))?;
        served
    }

    /// Starts serving on `addr` (port 0: any free port) on a runtime of its own, in the
    /// background.
    pub fn start(self, addr: SocketAddr) -> Result<RunningServer, ServeError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.shared.config.http_threads.max(1))
            .thread_name("burn-serve-http")
            .enable_all()
            .build()
            .map_err(|error| ServeError::Io(error.to_string()))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|error| ServeError::Io(format!("cannot listen on {addr}: {error}")))?;
        let addr = listener
            .local_addr()
            .map_err(|error| ServeError::Io(error.to_string()))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("burn-serve".to_string())
            .spawn(move || {
                runtime.block_on(self.serve(listener, async move {
                    let _ = stopped.await;
                }))
            })
            .map_err(|error| ServeError::Io(error.to_string()))?;
        tracing::info!("serving on http://{addr}");
        Ok(RunningServer { addr, stop, thread })
    }
}

/// A server running in the background ([`Server::start`]).
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), ServeError>>,
}

impl RunningServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shuts down gracefully and waits until every received request is answered.
    pub fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.stop.send(());
        self.thread
            .join()
            .map_err(|_| ServeError::Io("the server thread panicked".to_string()))?
    }

    /// Serves until the process receives Ctrl-C (SIGINT), then shuts down gracefully.
    pub fn wait_for_ctrl_c(self) -> Result<(), ServeError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| ServeError::Io(error.to_string()))?;
        runtime
            .block_on(tokio::signal::ctrl_c())
            .map_err(|error| ServeError::Io(error.to_string()))?;
        self.shutdown()
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.config.max_body_bytes;
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(model_metadata_version),
        )
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(model_ready_version),
        )
        .route("/v2/models/{name}/infer", post(infer))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(infer_version),
        )
        .route("/metrics", get(metrics))
        .fallback(|| async { error(&ServeError::bad("no such endpoint"), StatusCode::NOT_FOUND) })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(shared)
}

fn error(error: &ServeError, status: StatusCode) -> Response {
    let body = ErrorResponse {
        error: error.to_string(),
    };
    (status, axum::Json(body)).into_response()
}

fn error_response(err: &ServeError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(err, status)
}

impl Shared {
    fn model(&self, name: &str, version: Option<&str>) -> Result<&Model, ServeError> {
        let model = self
            .models
            .get(name)
            .ok_or_else(|| ServeError::UnknownModel(name.to_string()))?;
        match version {
            Some(version) if version != model.spec.version => Err(ServeError::UnknownModel(
                format!("{name}' version '{version}"),
            )),
            _ => Ok(model),
        }
    }
}

async fn server_metadata(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(ServerMetadata {
        name: shared.config.name.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        extensions: Vec::new(),
    })
    .into_response()
}

async fn server_ready(State(shared): State<Arc<Shared>>) -> StatusCode {
    if shared.ready.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

async fn model_metadata(State(shared): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    metadata(&shared, &name, None)
}

async fn model_metadata_version(
    State(shared): State<Arc<Shared>>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    metadata(&shared, &name, Some(&version))
}

fn metadata(shared: &Shared, name: &str, version: Option<&str>) -> Response {
    match shared.model(name, version) {
        Ok(model) => axum::Json(ModelMetadata::from(&model.spec)).into_response(),
        Err(err) => error_response(&err),
    }
}

async fn model_ready(State(shared): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    ready(&shared, &name, None)
}

async fn model_ready_version(
    State(shared): State<Arc<Shared>>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    ready(&shared, &name, Some(&version))
}

fn ready(shared: &Shared, name: &str, version: Option<&str>) -> Response {
    match shared.model(name, version) {
        Ok(_) if shared.ready.load(Ordering::SeqCst) => StatusCode::OK.into_response(),
        Ok(_) => error_response(&ServeError::ShuttingDown),
        Err(err) => error_response(&err),
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    for model in shared.models.values() {
        model.metrics.set_queue_depth(model.batcher.queue_depth());
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
        .into_response()
}

async fn infer(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    infer_any(&shared, &name, None, &headers, &body).await
}

async fn infer_version(
    State(shared): State<Arc<Shared>>,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    infer_any(&shared, &name, Some(&version), &headers, &body).await
}

/// An answer to an inference request: JSON, or JSON and binary outputs.
enum Reply {
    Json(InferResponse),
    Binary(Vec<u8>, usize),
}

async fn infer_any(
    shared: &Shared,
    name: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let arrived = Instant::now();
    let model = match shared.model(name, version) {
        Ok(model) => model,
        // Unknown names get no time series of their own: clients would choose its labels.
        Err(err) => return error_response(&err),
    };
    let answer = match header_length(headers) {
        Ok(length) => run(shared, model, body, length, arrived).await,
        Err(err) => Err(err),
    };
    let response = match answer {
        Ok(Reply::Json(response)) => axum::Json(response).into_response(),
        Ok(Reply::Binary(body, length)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (HeaderName::from_static(HEADER_LENGTH), length.to_string()),
            ],
            body,
        )
            .into_response(),
        Err(err) => error_response(&err),
    };
    model
        .metrics
        .observe_request(response.status().as_str(), arrived.elapsed().as_secs_f64());
    response
}

fn header_length(headers: &HeaderMap) -> Result<Option<usize>, ServeError> {
    headers
        .get(HEADER_LENGTH)
        .map(|value| {
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| ServeError::bad(format!("{HEADER_LENGTH} is not a byte count")))
        })
        .transpose()
}

async fn run(
    shared: &Shared,
    model: &Model,
    body: &[u8],
    header_length: Option<usize>,
    arrived: Instant,
) -> Result<Reply, ServeError> {
    let (json, binary) = split_body(body, header_length)?;
    let request: InferRequest = serde_json::from_slice(json)
        .map_err(|error| ServeError::bad(format!("malformed request: {error}")))?;
    let input = request.input_for(&model.spec, binary)?;
    let timeout = request
        .timeout_micros()?
        .map(Duration::from_micros)
        .or(shared.config.request_timeout);
    let deadline = timeout.map(|timeout| arrived + timeout);
    let ticket = model.batcher.submit(input, deadline)?;
    let output = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.into(), ticket.result())
            .await
            .unwrap_or_else(|_| {
                Err(ServeError::DeadlineExceeded {
                    waited_ms: arrived.elapsed().as_secs_f64() * 1e3,
                })
            })?,
        None => ticket.result().await?,
    };
    let binary = request.wants_binary_output();
    let (tensor, bytes) = if binary {
        let (tensor, bytes) = JsonTensor::binary_from_host(&model.spec.output.name, &output);
        (tensor, Some(bytes))
    } else {
        (
            JsonTensor::from_host(&model.spec.output.name, &output),
            None,
        )
    };
    let response = InferResponse {
        model_name: model.spec.name.clone(),
        model_version: Some(model.spec.version.clone()),
        id: request.id,
        parameters: None,
        outputs: vec![tensor],
    };
    Ok(match bytes {
        Some(bytes) => {
            let (body, length) = binary_body(&response, &[bytes]);
            Reply::Binary(body, length)
        }
        None => Reply::Json(response),
    })
}
