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
//! - [`TextModel`]: text in for an embedding model, its [`Tokenize`]r run on the server:
//!   `BYTES` tensors on the protocol, and TEI's and OpenAI's embedding endpoints
//!   ([`embeddings`]) on the same batcher.
//!
//! Modules: `batcher`, `server` (axum) and its [`protocol`] messages, `tensor` (the host
//! tensors requests carry), `model` ([`Servable`], [`BurnModel`]), `metrics` (Prometheus) and
//! `client` (hyper).
//!
//! The book's chapter "Serving a model" walks through launching, the protocol, the batching
//! knobs and measured latency curves.
//!
//! The crate README's example starts a server and queries it with the client.

#![warn(missing_docs)]

mod batcher;
mod client;
pub mod embeddings;
mod error;
mod metrics;
mod model;
pub mod protocol;
mod server;
mod sync;
mod tensor;
mod text;

pub use batcher::{Batcher, BatcherConfig, Ticket};
pub use client::{Answer, Client};
pub use error::ServeError;
pub use metrics::{Metrics, ModelMetrics};
pub use model::{BurnModel, CountTokens, ModelSpec, Servable, TensorSpec, Validate};
pub use server::{RunningServer, Server, ServerConfig};
pub use tensor::{DataType, HostData, HostTensor};
pub use text::{Encoded, TextModel, Token, Tokenize};

/// The crate README's example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
