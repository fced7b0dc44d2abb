//! Shared pieces of the burn-sketch examples (`examples/examples/*.rs`), of the serving example
//! (`examples-serve`, a package of its own) and of the smoke tests (`examples-smoke-tests`).
//!
//! The MNIST classifier:
//! - [`mnist`]: the IDX reader and the 10,000-digit sample embedded in this crate;
//! - [`data`]: MNIST as a Burn dataset and batcher;
//! - [`mlp`]: the MLP the examples train, its hidden layers sketched or dense;
//! - [`training`]: `train_mnist`'s run in burn-train's learner (metrics, dashboard, resumable
//!   checkpoints, mixed precision, segment checkpointing, batch-size search, data parallel), the
//!   evaluation, and the plain Adam loop the other MNIST studies share;
//! - [`checkpoint`]: checkpoints that survive the process being killed while they are written;
//! - [`progress`]: one line per epoch when the output is not a terminal.
//!
//! The language model:
//! - [`lm`]: the character corpus and the transformer of the `language_model` study, with its
//!   profiled steps ([`lm::profile`]) and its tables, CSV, curves and JSON ([`lm::report`]).
//!
//! What the examples share around them:
//! - [`backend`]: the `--backend` option and the dispatch to a backend type
//!   ([`with_backend!`]);
//! - [`parallel`]: data parallel (`--devices`, `--mpi`), or stand-ins without the features;
//! - [`profile_args`]: the `--profile` options of the examples that train;
//! - [`stats`]: medians, the median timer and megabytes (also compiled into `xtask`).
//!
//! The book's pages are doctests of this crate (`book`, compiled only for doctests), except the
//! serving page, a doctest of `examples-serve`.

pub mod backend;
#[cfg(doctest)]
pub mod book;
pub mod checkpoint;
pub mod data;
pub mod encoder;
pub mod lm;
pub mod mlp;
pub mod mnist;
pub mod parallel;
pub mod profile_args;
pub mod progress;
pub mod stats;
pub mod training;
