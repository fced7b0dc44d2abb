//! Data-parallel training for Burn, on every backend: one peer per device or thread, each with
//! its shard of the data, the gradients averaged over all peers before each optimizer step.
//!
//! - [`DataParallel`]: a training strategy for burn-train's learner, on burn-collective. The
//!   replicas (fixed sketches included) are checked at the start; every collective operation
//!   is bounded in time; burn-memory's mixed precision takes its skip decisions on the mean
//!   gradients, the same on every peer. With [`NodeConfig`], processes on several machines
//!   train together through burn-collective's global orchestrator ([`run_orchestrator`]).
//! - [`Peer`]: the same machinery for a training loop of one's own.
//!
//! Layers placed on several devices (model parallelism) are burn-memory's
//! [`Placement`](burn_memory::Placement).
//!
//! Why burn-collective and not burn-train's own DDP: Burn 0.21's DDP reduces through CubeCL's
//! `all_reduce` (NCCL on CUDA only) and, once its `distributed` feature is on, makes
//! `Autodiff<B>` require a distributed backend, which Flex and NdArray are not. burn-collective
//! is generic over the backend and reaches other processes over WebSocket.

#![warn(missing_docs)]

mod bucket;
mod config;
mod error;
mod orchestrator;
mod peer;
mod renewal;
mod step;
mod strategy;

pub use config::{DataParallelConfig, NodeConfig};
pub use error::DistributedError;
pub use orchestrator::{run_orchestrator, spawn_orchestrator};
pub use peer::Peer;
pub use strategy::{DataParallel, DataParallelReport};
