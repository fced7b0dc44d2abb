//! A client for the Open Inference Protocol over one keep-alive HTTP/1.1 connection (hyper's
//! client): what the tests and the load generator use, and a start for Rust clients.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use crate::ServeError;
use crate::protocol::{ErrorResponse, InferRequest, InferResponse};

/// An HTTP answer: status and body.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The body.
    pub body: Bytes,
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
        Ok(Self { addr, sender })
    }

    /// Sends `method path` with `body` and returns the answer; reconnects first when the server
    /// closed the connection.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Answer, ServeError> {
        if self.sender.is_closed() || self.sender.ready().await.is_err() {
            *self = Self::connect(self.addr).await?;
        }
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| ServeError::Io(error.to_string()))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|error| ServeError::Io(error.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| ServeError::Io(error.to_string()))?
            .to_bytes();
        Ok(Answer { status, body })
    }

    /// `POST path` with a JSON `body`.
    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> Result<Answer, ServeError> {
        self.send(Method::POST, path, body).await
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<Answer, ServeError> {
        self.send(Method::GET, path, Vec::new()).await
    }

    /// Runs `request` on `model`; an error answer becomes a [`ServeError`] carrying the
    /// server's message.
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
        serde_json::from_slice(&answer.body)
            .map_err(|error| ServeError::Model(format!("unreadable response: {error}")))
    }
}
