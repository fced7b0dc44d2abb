//! Data-parallel training for Burn, on every backend: one peer per device or thread, each with
//! its shard of the data, the gradients averaged over all peers before each optimizer step.
//!
//! - [`DataParallel`]: a training strategy for burn-train's learner. The replicas (fixed
//!   sketches included) are checked at the start; every collective operation is bounded in
//!   time; burn-memory's mixed precision takes its skip decisions on the mean gradients, the
//!   same on every peer.
//! - [`Peer`]: the same machinery for a training loop of one's own.
//! - Several machines: with the `mpi` feature and [`DataParallelConfig::mpi`], each process of
//!   an MPI job (`mpirun`, `srun`) runs its peers, and the processes' gradients meet in MPI's
//!   all-reduce ([`Mpi`]).
//!
//! Modules: `strategy` ([`DataParallel`] in the learner), `peer` ([`Peer`] on
//! burn-collective), `bucket` (the gradients packed for one all-reduce), `step` (the reduction
//! inside a mixed-precision step), `processes` (`Mpi`, the all-reduce across processes),
//! `config` and `error`.
//!
//! Layers placed on several devices (model parallelism) are burn-memory's
//! [`Placement`](burn_memory::Placement).
//!
//! Which engine does what: peers in one process reduce through burn-collective's local server
//! (in memory, generic over the backend); processes reduce through MPI, the collective every
//! cluster has. Burn 0.21's DDP is not used: it reduces through CubeCL's `all_reduce` (NCCL on
//! CUDA only) and, once its `distributed` feature is on, makes `Autodiff<B>` require a
//! distributed backend, which Flex and NdArray are not.

#![warn(missing_docs)]

mod bucket;
mod config;
mod error;
mod peer;
#[cfg(feature = "mpi")]
mod processes;
mod step;
mod strategy;
mod sync;

pub use config::DataParallelConfig;
pub use error::DistributedError;
pub use peer::Peer;
#[cfg(feature = "mpi")]
pub use processes::Mpi;
pub use strategy::{DataParallel, DataParallelReport};
