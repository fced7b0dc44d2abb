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
//!
//! With a [`TextModel`] ([`Server::add_text_model`]), the embedding endpoints too (messages in
//! [`crate::embeddings`]), and the model's `infer` takes a `BYTES` tensor of texts as well:
//!
//! | endpoint | answer |
//! |---|---|
//! | `POST /embed` (TEI) | one array of floats per input |
//! | `POST /v1/embeddings` (OpenAI) | [`OpenAiResponse`] |
//! | `GET /v1/models` (OpenAI) | the text models |
//! | `POST /tokenize` (TEI) | each input's tokens |
//! | `GET /info` (TEI) | [`Info`] |
//! | `GET /health` (TEI) | 200, or 503 once shutting down |
//!
//! With an API key ([`ServerConfig::api_key`]), every endpoint but the health checks wants
//! `Authorization: Bearer KEY` and answers 401 without it.

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

use axum::extract::Request;
use axum::middleware::{self, Next};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::embeddings::{
    EmbedRequest, EncodingFormat, Info, Input, OpenAiEmbedding, OpenAiError, OpenAiErrorBody,
    OpenAiRequest, OpenAiResponse, TeiError, TokenizeRequest, Usage,
};
use crate::metrics::{Metrics, ModelMetrics};
use crate::protocol::{
    ErrorResponse, HEADER_LENGTH, InferRequest, InferResponse, JsonTensor, MetadataTensor,
    ModelMetadata, ServerMetadata, binary_body, host_tensors, split_body,
};
use crate::text::{Embedded, Inputs, TextFront, rows_of};
use crate::{
    Batcher, BatcherConfig, DataType, HostData, HostTensor, ModelSpec, Servable, ServeError,
    TextModel, Ticket,
};

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
    /// The key every request but the health checks must send as `Authorization: Bearer KEY`
    /// (401 without it); `None`: no key.
    pub api_key: Option<String>,
}

impl Default for ServerConfig {
    /// `burn-serve`, 16 MiB bodies, 10 s deadline, 2 HTTP threads, no API key.
    fn default() -> Self {
        Self {
            name: "burn-serve".to_string(),
            max_body_bytes: 16 << 20,
            request_timeout: Some(Duration::from_secs(10)),
            http_threads: 2,
            api_key: None,
        }
    }
}

struct Model {
    spec: ModelSpec,
    batcher: Batcher,
    metrics: ModelMetrics,
    text: Option<TextFront>,
}

struct Shared {
    config: ServerConfig,
    models: HashMap<String, Model>,
    /// The text models' names, in the order added: `/embed` serves the first.
    text_models: Vec<String>,
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
                text_models: Vec::new(),
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
        self.add(spec, batching, replicas, None)
    }

    /// Serves `spec.name` as [`add_model`](Self::add_model) does, and takes text for it: the
    /// embedding endpoints, and a `BYTES` input named `text.text_input` on `infer`. The
    /// model's input must be `INT64 [-1, width]` token ids, padded at the end with
    /// `text.pad_id`, with `width` at least the tokenizer's `max_length`; its output
    /// `FP32 [-1, hidden]`, one embedding per row.
    pub fn add_text_model<S: Servable>(
        &mut self,
        spec: ModelSpec,
        batching: BatcherConfig,
        replicas: Vec<S>,
        text: TextModel,
    ) -> Result<&mut Self, ServeError> {
        if spec.input.datatype != DataType::Int64
            || spec.input.shape.len() != 2
            || spec.output.datatype != DataType::Fp32
            || spec.output.shape.len() != 2
        {
            return Err(ServeError::invalid(
                "text model",
                "its input must be INT64 [-1, width] token ids and its output FP32 [-1, hidden]",
            ));
        }
        let width = spec.input.row_shape()[0];
        let front = TextFront::new(text, width)?;
        let name = spec.name.clone();
        self.add(spec, batching, replicas, Some(front))?;
        self.shared.text_models.push(name);
        Ok(self)
    }

    fn add<S: Servable>(
        &mut self,
        spec: ModelSpec,
        batching: BatcherConfig,
        replicas: Vec<S>,
        text: Option<TextFront>,
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
                text,
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
        .route("/embed", post(tei_embed))
        .route("/tokenize", post(tei_tokenize))
        .route("/info", get(tei_info))
        .route("/health", get(health))
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/v1/models", get(openai_models))
        .fallback(|| async { error(&ServeError::bad("no such endpoint"), StatusCode::NOT_FOUND) })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            authorize,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(shared)
}

/// Refuses a request without the server's API key (health checks excepted): 401, in the
/// error shape of the endpoint's family.
async fn authorize(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let Some(key) = &shared.config.api_key else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    if matches!(path, "/health" | "/v2/health/live" | "/v2/health/ready") {
        return next.run(request).await;
    }
    let sent = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match sent {
        Some(sent) if same_key(sent.trim().as_bytes(), key.as_bytes()) => next.run(request).await,
        _ => {
            let err = ServeError::Unauthorized(match sent {
                None => "this server wants an API key: send `Authorization: Bearer KEY`".into(),
                Some(_) => "the API key is wrong".into(),
            });
            if path.starts_with("/v1/") {
                openai_error(&err)
            } else if path.starts_with("/v2") {
                error_response(&err)
            } else {
                tei_error(&err)
            }
        }
    }
}

/// Compares keys in time independent of where they differ.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
        Ok(model) => {
            let mut metadata = ModelMetadata::from(&model.spec);
            if let Some(front) = &model.text {
                // The texts the model takes besides its ids: one of the two per request.
                metadata.inputs.push(MetadataTensor {
                    name: front.model.text_input.clone(),
                    datatype: DataType::Bytes.name().to_string(),
                    shape: vec![-1],
                });
            }
            axum::Json(metadata).into_response()
        }
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
    let timeout = request
        .timeout_micros()?
        .map(Duration::from_micros)
        .or(shared.config.request_timeout);
    let deadline = timeout.map(|timeout| arrived + timeout);
    let texts = model.text.as_ref().filter(|front| {
        matches!(request.inputs.as_slice(), [input]
            if input.name == front.model.text_input && input.datatype == "BYTES")
    });
    let output = match texts {
        Some(front) => {
            let [tensor] = host_tensors(&request.inputs, binary)?
                .try_into()
                .map_err(|_| ServeError::bad("one input"))?;
            let HostData::Bytes(texts) = tensor.into_data() else {
                unreachable!("a BYTES tensor")
            };
            // `parameters.truncate` as TEI's `truncate`, else the server's default.
            let truncate = request
                .parameters
                .as_ref()
                .and_then(|p| p.get("truncate"))
                .and_then(Value::as_bool);
            let ids = front.ids(Inputs::Texts(texts), truncate).await?;
            let tickets = front.submit(&model.batcher, &ids, deadline)?;
            HostTensor::concat(wait_all(tickets, deadline, arrived).await?)?
        }
        None => {
            let input = request.input_for(&model.spec, binary)?;
            let ticket = model.batcher.submit(input, deadline)?;
            wait(ticket, deadline, arrived).await?
        }
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

/// A ticket's answer, or [`ServeError::DeadlineExceeded`] at `deadline`.
async fn wait(
    ticket: Ticket,
    deadline: Option<Instant>,
    arrived: Instant,
) -> Result<HostTensor, ServeError> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.into(), ticket.result())
            .await
            .unwrap_or_else(|_| {
                Err(ServeError::DeadlineExceeded {
                    waited_ms: arrived.elapsed().as_secs_f64() * 1e3,
                })
            }),
        None => ticket.result().await,
    }
}

/// Every ticket's answer, in order (all were submitted: they run while the first is awaited).
async fn wait_all(
    tickets: Vec<Ticket>,
    deadline: Option<Instant>,
    arrived: Instant,
) -> Result<Vec<HostTensor>, ServeError> {
    let mut outputs = Vec::with_capacity(tickets.len());
    for ticket in tickets {
        outputs.push(wait(ticket, deadline, arrived).await?);
    }
    Ok(outputs)
}

// The embedding endpoints.

/// TEI's error type of an error.
fn tei_kind(err: &ServeError) -> &'static str {
    match err {
        ServeError::TooLarge { .. }
        | ServeError::TooManyTokens { .. }
        | ServeError::InputTooLong { .. }
        | ServeError::BadRequest(_)
        | ServeError::UnknownModel(_)
        | ServeError::Invalid { .. } => "validation",
        ServeError::Unauthorized(_) => "unauthorized",
        ServeError::Overloaded { .. } | ServeError::MemoryLimit(_) => "overloaded",
        ServeError::ShuttingDown => "unhealthy",
        _ => "backend",
    }
}

fn tei_error(err: &ServeError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = TeiError {
        error: err.to_string(),
        error_type: tei_kind(err).to_string(),
    };
    (status, axum::Json(body)).into_response()
}

fn openai_error(err: &ServeError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = match status.as_u16() {
        401 => "authentication_error",
        503 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    let param = match err {
        ServeError::UnknownModel(_) => Some("model".to_string()),
        ServeError::TooLarge { .. } | ServeError::InputTooLong { .. } => Some("input".to_string()),
        _ => None,
    };
    let body = OpenAiError {
        error: OpenAiErrorBody {
            message: err.to_string(),
            kind: kind.to_string(),
            param,
            code: Some(status.as_u16().to_string()),
        },
    };
    (status, axum::Json(body)).into_response()
}

impl Shared {
    /// The text model `/embed` and `/tokenize` serve: the first added.
    fn text_model(&self, name: Option<&str>) -> Result<(&Model, &TextFront), ServeError> {
        let found = match name {
            Some(name) if self.text_models.iter().any(|served| served == name) => Some(name),
            // TEI serves one model and ignores the name; so does this server with one.
            Some(_) if self.text_models.len() == 1 => Some(self.text_models[0].as_str()),
            Some(name) => return Err(ServeError::UnknownModel(name.to_string())),
            None => self.text_models.first().map(String::as_str),
        };
        let model = found
            .and_then(|name| self.models.get(name))
            .ok_or_else(|| ServeError::UnknownModel("no text model is served".to_string()))?;
        let front = model.text.as_ref().expect("a text model has a front");
        Ok((model, front))
    }
}

fn inputs_of(input: Input) -> Inputs {
    match input {
        Input::Text(text) => Inputs::Texts(vec![text.into_bytes()]),
        Input::Texts(texts) => Inputs::Texts(texts.into_iter().map(String::into_bytes).collect()),
        Input::Ids(ids) => Inputs::Ids(vec![ids]),
        Input::IdLists(ids) => Inputs::Ids(ids),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ServeError> {
    serde_json::from_slice(body)
        .map_err(|error| ServeError::bad(format!("malformed request: {error}")))
}

/// Embeds `inputs` on `model`: tokenized, batched with everything else the model serves, and
/// normalized when asked.
async fn embed(
    shared: &Shared,
    model: &Model,
    front: &TextFront,
    inputs: Inputs,
    truncate: Option<bool>,
    normalize: bool,
    arrived: Instant,
) -> Result<Embedded, ServeError> {
    let deadline = shared
        .config
        .request_timeout
        .map(|timeout| arrived + timeout);
    let ids = front.ids(inputs, truncate).await?;
    let tickets = front.submit(&model.batcher, &ids, deadline)?;
    let outputs = wait_all(tickets, deadline, arrived).await?;
    Ok(Embedded::new(rows_of(outputs, normalize)?, &ids))
}

/// Runs `answer` for a text model and records its status and latency in the model's metrics;
/// errors in the shape `fail` writes.
async fn observed(
    shared: &Shared,
    name: Option<&str>,
    fail: fn(&ServeError) -> Response,
    answer: impl AsyncFnOnce(&Model, &TextFront, Instant) -> Result<Response, ServeError>,
) -> Response {
    let arrived = Instant::now();
    let (model, front) = match shared.text_model(name) {
        Ok(found) => found,
        Err(err) => return fail(&err),
    };
    let response = answer(model, front, arrived)
        .await
        .unwrap_or_else(|err| fail(&err));
    model
        .metrics
        .observe_request(response.status().as_str(), arrived.elapsed().as_secs_f64());
    response
}

async fn tei_embed(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let request: EmbedRequest = match parse(&body) {
        Ok(request) => request,
        Err(err) => return tei_error(&err),
    };
    observed(&shared, None, tei_error, async |model, front, arrived| {
        let embedded = embed(
            &shared,
            model,
            front,
            inputs_of(request.inputs),
            request.truncate,
            request.normalize,
            arrived,
        )
        .await?;
        Ok(axum::Json(embedded.rows).into_response())
    })
    .await
}

async fn tei_tokenize(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let request: TokenizeRequest = match parse(&body) {
        Ok(request) => request,
        Err(err) => return tei_error(&err),
    };
    let texts = match request.inputs {
        Input::Text(text) => vec![text],
        Input::Texts(texts) => texts,
        Input::Ids(_) | Input::IdLists(_) => {
            return tei_error(&ServeError::bad("`inputs` must be texts to tokenize"));
        }
    };
    let add_special = request.add_special_tokens;
    observed(&shared, None, tei_error, async |_, front, _| {
        if texts.len() > front.model.max_client_batch_size {
            return Err(ServeError::TooLarge {
                rows: texts.len(),
                max: front.model.max_client_batch_size,
            });
        }
        let tokenizer = Arc::clone(&front.model.tokenizer);
        let tokens = tokio::task::spawn_blocking(move || {
            texts
                .iter()
                .map(|text| tokenizer.tokens(text, add_special))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|error| ServeError::Model(format!("the tokenizer panicked: {error}")))??;
        Ok(axum::Json(tokens).into_response())
    })
    .await
}

async fn tei_info(State(shared): State<Arc<Shared>>) -> Response {
    match shared.text_model(None) {
        Ok((model, front)) => {
            let config = model.batcher.config();
            axum::Json(Info {
                model_id: front.model.model_id.clone(),
                model_dtype: front.model.dtype.clone(),
                model_type: json!({ "embedding": { "pooling": front.model.pooling } }),
                normalized: front.model.normalized,
                max_concurrent_requests: config.queue_capacity,
                max_input_length: front.max_length(),
                max_batch_tokens: config.max_batch_tokens,
                max_batch_requests: config.max_batch_size,
                max_client_batch_size: front.model.max_client_batch_size,
                auto_truncate: front.model.truncate,
                tokenization_workers: front.model.tokenization_workers,
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .into_response()
        }
        Err(err) => tei_error(&err),
    }
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.ready.load(Ordering::SeqCst) {
        StatusCode::OK.into_response()
    } else {
        tei_error(&ServeError::ShuttingDown)
    }
}

async fn openai_embeddings(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let request: OpenAiRequest = match parse(&body) {
        Ok(request) => request,
        Err(err) => return openai_error(&err),
    };
    let name = request.model.clone();
    observed(&shared, Some(&name), openai_error, async |model, front, arrived| {
        let hidden = model.spec.output.row_shape()[0];
        if let Some(dimensions) = request.dimensions
            && dimensions != hidden
        {
            return Err(ServeError::bad(format!(
                "dimensions {dimensions}: this model's embeddings have {hidden}, and it was not \
                 trained to be cut"
            )));
        }
        let embedded = embed(
            &shared,
            model,
            front,
            inputs_of(request.input),
            None,
            true,
            arrived,
        )
        .await?;
        let data = embedded
            .rows
            .into_iter()
            .enumerate()
            .map(|(index, row)| OpenAiEmbedding {
                object: "embedding".into(),
                embedding: match request.encoding_format {
                    EncodingFormat::Float => {
                        Value::Array(row.iter().map(|&v| Value::from(f64::from(v))).collect())
                    }
                    EncodingFormat::Base64 => {
                        let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
                        Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
                    }
                },
                index,
            })
            .collect();
        Ok(axum::Json(OpenAiResponse {
            object: "list".into(),
            data,
            model: model.spec.name.clone(),
            usage: Usage {
                prompt_tokens: embedded.tokens,
                total_tokens: embedded.tokens,
            },
        })
        .into_response())
    })
    .await
}

async fn openai_models(State(shared): State<Arc<Shared>>) -> Response {
    let data: Vec<Value> = shared
        .text_models
        .iter()
        .map(
            |name| json!({ "id": name, "object": "model", "created": 0, "owned_by": "burn-serve" }),
        )
        .collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}
