//! A client for the Open Inference Protocol over one keep-alive HTTP/1.1 connection (hyper's
//! client): what the tests and the load generator use, and a start for Rust clients.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use crate::protocol::{
    ErrorResponse, HEADER_LENGTH, InferRequest, InferResponse, JsonTensor, binary_body,
    host_tensors, split_body,
};
use crate::{HostTensor, ServeError};

/// An HTTP answer: status and body.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The body.
    pub body: Bytes,
    /// The JSON part's length, when the body carries binary tensor data.
    pub header_length: Option<usize>,
}

impl Answer {
    /// The error message of an error answer (`{"error": ...}`), if it is one.
    pub fn error(&self) -> Option<String> {
        serde_json::from_slice::<ErrorResponse>(&self.body)
            .ok()
            .map(|body| body.error)
    }
}

/// One connection to a server; requests on it are sequential (open one per concurrent user).
#[derive(Debug)]
pub struct Client {
    addr: SocketAddr,
    sender: http1::SendRequest<Full<Bytes>>,
    api_key: Option<String>,
}

impl Client {
    /// Connects to `addr` (needs a tokio runtime).
    pub async fn connect(addr: SocketAddr) -> Result<Self, ServeError> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|error| ServeError::Io(format!("cannot connect to {addr}: {error}")))?;
        stream
            .set_nodelay(true)
            .map_err(|error| ServeError::Io(error.to_string()))?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| ServeError::Io(error.to_string()))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!("connection closed: {error}");
            }
        });
        Ok(Self {
            addr,
            sender,
            api_key: None,
        })
    }

    /// The same connection sending `key` as `Authorization: Bearer KEY` with every request
    /// (a server with [`crate::ServerConfig::api_key`] wants it).
    pub fn with_api_key(self, key: impl Into<String>) -> Self {
        Self {
            api_key: Some(key.into()),
            ..self
        }
    }

    /// Sends `method path` with `body` and returns the answer; reconnects first when the server
    /// closed the connection.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Answer, ServeError> {
        self.send_with(method, path, body, None).await
    }

    /// [`Client::send`] with binary tensor data: `header_length` is the JSON part's length.
    pub async fn send_with(
        &mut self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        header_length: Option<usize>,
    ) -> Result<Answer, ServeError> {
        if self.sender.is_closed() || self.sender.ready().await.is_err() {
            let api_key = self.api_key.take();
            *self = Self::connect(self.addr).await?;
            self.api_key = api_key;
        }
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.addr.to_string());
        if let Some(key) = &self.api_key {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        request = match header_length {
            Some(length) => request
                .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
                .header(HEADER_LENGTH, length),
            None => request.header(hyper::header::CONTENT_TYPE, "application/json"),
        };
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| ServeError::Io(error.to_string()))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|error| ServeError::Io(error.to_string()))?;
        let status = response.status().as_u16();
        let header_length = response
            .headers()
            .get(HEADER_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| ServeError::Io(error.to_string()))?
            .to_bytes();
        Ok(Answer {
            status,
            body,
            header_length,
        })
    }

    /// `POST path` with a JSON `body`.
    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> Result<Answer, ServeError> {
        self.send(Method::POST, path, body).await
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<Answer, ServeError> {
        self.send(Method::GET, path, Vec::new()).await
    }

    /// Runs `request` on `model`, in JSON; an error answer becomes a [`ServeError`] carrying
    /// the server's message.
    pub async fn infer(
        &mut self,
        model: &str,
        request: &InferRequest,
    ) -> Result<InferResponse, ServeError> {
        let body =
            serde_json::to_vec(request).map_err(|error| ServeError::bad(error.to_string()))?;
        let answer = self
            .send(Method::POST, &format!("/v2/models/{model}/infer"), body)
            .await?;
        Self::response(answer).map(|(response, _)| response)
    }

    /// Runs `input` (named `input_name`) on `model` with binary tensor data both ways, as
    /// Triton's clients do; the outputs come back decoded.
    pub async fn infer_binary(
        &mut self,
        model: &str,
        input_name: &str,
        input: &HostTensor,
    ) -> Result<(InferResponse, Vec<HostTensor>), ServeError> {
        let (tensor, bytes) = JsonTensor::binary_from_host(input_name, input);
        let request = InferRequest {
            id: None,
            parameters: Some(serde_json::json!({ "binary_data_output": true })),
            inputs: vec![tensor],
            outputs: None,
        };
        let (body, length) = binary_body(&request, &[bytes]);
        let path = format!("/v2/models/{model}/infer");
        let answer = self
            .send_with(Method::POST, &path, body, Some(length))
            .await?;
        Self::response(answer)
    }

    /// An answer's response and its outputs (JSON or binary), or the error it carries.
    fn response(answer: Answer) -> Result<(InferResponse, Vec<HostTensor>), ServeError> {
        if answer.status != 200 {
            let message = answer.error().unwrap_or_default();
            return Err(match answer.status {
                404 => ServeError::UnknownModel(message),
                503 => ServeError::ShuttingDown,
                504 => ServeError::DeadlineExceeded {
                    waited_ms: f64::NAN,
                },
                400..=499 => ServeError::BadRequest(message),
                _ => ServeError::Model(message),
            });
        }
        let unreadable = |error: String| ServeError::Model(format!("unreadable response: {error}"));
        let (json, binary) = split_body(&answer.body, answer.header_length)
            .map_err(|error| unreadable(error.to_string()))?;
        let response: InferResponse =
            serde_json::from_slice(json).map_err(|error| unreadable(error.to_string()))?;
        let outputs = host_tensors(&response.outputs, binary)
            .map_err(|error| unreadable(error.to_string()))?;
        Ok((response, outputs))
    }
}
