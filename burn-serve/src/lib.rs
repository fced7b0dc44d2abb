//! Serve Burn models over HTTP, as Triton and KServe serve PyTorch ones: a client written for
//! them works against this server unchanged.
//!
//! - [`Batcher`]: dynamic batching. Requests queue; a batch runs when it holds
//!   `max_batch_size` rows or its oldest request has waited `max_queue_delay`
//!   ([`BatcherConfig`]). The queue is bounded ([`ServeError::Overloaded`]), each request may
//!   have a deadline, each worker thread owns one model replica, and shutdown finishes every
//!   accepted request.
//! - [`Server`]: the Open Inference Protocol v2 over HTTP/JSON ([`protocol`]): health,
//!   readiness, server and model metadata, inference; Prometheus metrics at `/metrics`
//!   ([`Metrics`]).
//! - [`BurnModel`]: any Burn module with its forward function as a [`Servable`] replica.
//! - [`Client`]: a client of the protocol on one keep-alive connection.
//!
//! The book's chapter "Serving a model" walks through launching, the protocol, the batching
//! knobs and measured latency curves.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::nn::LinearConfig;
//! use burn_serve::protocol::{InferRequest, JsonTensor};
//! use burn_serve::{BatcherConfig, BurnModel, Client, DataType, HostTensor, ModelSpec, Server, ServerConfig, TensorSpec};
//!
//! let device = Default::default();
//! let layer = LinearConfig::new(4, 3).init::<Flex>(&device);
//! let spec = ModelSpec {
//!     name: "tiny".into(),
//!     version: "1".into(),
//!     platform: "burn-flex".into(),
//!     input: TensorSpec::rows("x", DataType::Fp32, &[4]),
//!     output: TensorSpec::rows("y", DataType::Fp32, &[3]),
//! };
//! let mut server = Server::new(ServerConfig::default());
//! server.add_model(spec, BatcherConfig::default(), vec![BurnModel::float(layer, device, |l, x| l.forward(x))])?;
//! let running = server.start("127.0.0.1:0".parse().unwrap())?;
//!
//! let runtime = tokio::runtime::Runtime::new().unwrap();
//! let response = runtime.block_on(async {
//!     let mut client = Client::connect(running.addr()).await?;
//!     let x = HostTensor::f32(2, 4, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])?;
//!     let request = InferRequest { id: Some("1".into()), parameters: None, inputs: vec![JsonTensor::from_host("x", &x)], outputs: None };
//!     client.infer("tiny", &request).await
//! })?;
//! assert_eq!(response.outputs[0].shape, vec![2, 3]);
//! running.shutdown()?;
//! # Ok::<(), burn_serve::ServeError>(())
//! ```

#![warn(missing_docs)]

mod batcher;
mod client;
mod error;
mod metrics;
mod model;
pub mod protocol;
mod server;
mod tensor;

pub use batcher::{Batcher, BatcherConfig, Ticket};
pub use client::{Answer, Client};
pub use error::ServeError;
pub use metrics::{Metrics, ModelMetrics};
pub use model::{BurnModel, ModelSpec, Servable, TensorSpec};
pub use server::{RunningServer, Server, ServerConfig};
pub use tensor::{DataType, HostData, HostTensor};
