//! Training on several devices and machines, on Burn's own engines.
//!
//! - [`placement`]: consecutive layers of a [`Layers`](crate::Layers) model placed on a list of
//!   devices (model parallelism), activations moved between them in the forward pass.
//! - [`DataParallel`] (feature `collective`, on by default): data-parallel training in
//!   burn-train's learner on burn-collective. One peer per device or thread, each with its
//!   shard of the data; the gradients averaged over all peers before each optimizer step; the
//!   replicas (fixed sketches included) checked at the start; every collective operation
//!   bounded in time. With [`NodeConfig`], processes on several machines train together
//!   through burn-collective's global orchestrator ([`run_orchestrator`]).
//!   [`Peer`] is the same machinery for a training loop of one's own.
//!
//! Why burn-collective and not burn-train's own DDP: Burn 0.21's DDP reduces through CubeCL's
//! `all_reduce` (NCCL on CUDA only) and, once its `distributed` feature is on, makes
//! `Autodiff<B>` require a distributed backend, which Flex and NdArray are not. burn-collective
//! is generic over the backend and reaches other processes over WebSocket.

#[cfg(feature = "collective")]
mod bucket;
#[cfg(feature = "collective")]
mod config;
#[cfg(feature = "collective")]
mod error;
#[cfg(feature = "collective")]
mod orchestrator;
#[cfg(feature = "collective")]
mod peer;
pub mod placement;
#[cfg(feature = "collective")]
mod renewal;
#[cfg(feature = "collective")]
pub(crate) mod step;
#[cfg(feature = "collective")]
mod strategy;

#[cfg(feature = "collective")]
pub use config::{DataParallelConfig, NodeConfig};
#[cfg(feature = "collective")]
pub use error::DistributedError;
#[cfg(feature = "collective")]
pub use orchestrator::{run_orchestrator, spawn_orchestrator};
#[cfg(feature = "collective")]
pub use peer::Peer;
pub use placement::{DeviceTransfer, MapLayer, Placed, Placement, ToDevice};
#[cfg(feature = "collective")]
pub use strategy::{DataParallel, DataParallelReport};
