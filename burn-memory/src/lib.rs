//! Memory tooling for Burn training, Burn-native and on every backend: what PyTorch users get
//! from `torch.cuda.memory_allocated`, `torch.utils.checkpoint`, `torch.amp` and Lightning's
//! batch-size finder. The modules follow what a user is doing; their items are also re-exported
//! here at the crate root (the offload tools as [`offload`]), except those of [`hooks`].
//!
//! - [`measure`]: how much memory a step takes and where it peaks.
//!   - [`MemoryTracker`]: bytes in use, reserved and peak on a device;
//!     [`MemoryTracker::profile`] runs a closure and reports before / after / peak.
//!   - [`MemoryMonitor`]: samples a device on a background thread into a [`Timeline`] with
//!     labelled phases, exported as CSV and plotted (PNG or SVG).
//!   - With the `train` feature, [`DeviceMemoryMetric`] puts device memory on burn-train's
//!     dashboard.
//! - [`training`]: the same training step in fewer bytes.
//!   - [`Checkpointing`]: selects Burn's autodiff checkpointing strategy for a training job.
//!   - [`segmented_backward`]: segment checkpointing (`checkpoint_sequential`) for any layer
//!     sequence that implements [`Layers`]: only segment inputs are kept (a tensor, or a
//!     [`SegmentState`] such as an activation with its residual stream and mask), each segment
//!     is recomputed in the backward pass with the first pass's dropout masks
//!     ([`SegmentSeeds`]), and running statistics are updated once per step.
//!   - [`MixedPrecision`]: half-precision forward with f32 master weights and dynamic loss
//!     scaling that skips steps with non-finite gradients; [`SharedMixedPrecision`] keeps its
//!     state in a model, saved with the model's checkpoints.
//!   - [`BatchSizeSearch`]: the largest batch whose whole training step fits a memory budget,
//!     recovering from out-of-memory failures.
//! - [`inference`]: models and inputs larger than the device.
//!   - [`offload`]: tiered parameter offloading (device, host, compressed disk cache) with a
//!     learned-order prefetcher.
//!   - [`chunked_forward`]: inference over inputs too large for one pass, with bounded memory.
//!   - [`StreamingForward`]: inference over host data (a host tensor or an iterator of host
//!     chunks), a bounded number of chunks on the device at a time.
//! - [`limit`]: a serving process inside its memory.
//!   - [`release_cached`]: the allocator's cached blocks back to the device
//!     (`torch.cuda.empty_cache`).
//!   - [`MemoryCap`]: a per-device memory limit, checked before work and measured around it.
//! - [`placement`]: consecutive layers placed on several devices (model parallelism).
//!
//! Shared by several of these: [`Layers`] (a model as a sequence of layers, which segment
//! checkpointing, offloading and placement take), [`draw_params`] (lazily initialised
//! parameters drawn once, before a model is copied) and [`detach_params`] (a copy's parameters
//! on autodiff nodes of their own, so that trainings on several threads at once share none:
//! Burn 0.21 deadlocks when they do).
//!
//! [`hooks`] is not a user API: it is how burn-data-parallel reaches mixed precision and how
//! burn-profiler starts the allocation log.
//!
//! The per-operation profiler (`Profiled<B>`, memory snapshots, the viewer) is
//! [burn-profiler](https://docs.rs/burn-profiler), and data-parallel training is
//! [burn-data-parallel](https://docs.rs/burn-data-parallel); both build on this crate.
//!
//! Device memory comes from [`DeviceMemory`], implemented for NdArray and Flex (the heap, counted exactly
//! when a [`CountingAllocator`] is the global allocator, otherwise the process's resident
//! memory), every CubeCL backend (`Wgpu`, `Cuda`: the CubeCL memory pools), their fusion
//! wrappers and `Autodiff` over any of them.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_memory::MemoryTracker;
//!
//! let device = Default::default();
//! let tracker = MemoryTracker::<NdArray>::new(&device);
//! let (sum, report) = tracker.profile(|| {
//!     let x = Tensor::<NdArray, 2>::random([512, 512], Distribution::Default, &device);
//!     x.sum().into_scalar()
//! }).unwrap();
//! assert!(sum > 0.0);
//! println!("{report}");
//! ```

#![warn(missing_docs)]

mod error;
pub mod hooks;
pub mod inference;
mod layers;
pub mod limit;
pub mod measure;
#[cfg(test)]
#[path = "../../testing/own_process.rs"]
mod own_process;
mod params;
pub mod placement;
mod sync;
pub mod training;

pub use error::MemoryError;
pub use inference::{
    Streamed, StreamingForward, chunked_forward, offload, prefetch, stream_forward,
};
pub use layers::Layers;
pub use limit::{MemoryCap, MemoryReleased, release_cached};
#[cfg(feature = "wgpu")]
pub use measure::wgpu_adapter;
pub use measure::{
    Bytes, CountingAllocator, DeviceMemory, MemoryMonitor, MemoryReport, MemorySource,
    MemoryStream, MemoryTracker, MemoryUsage, Phase, Sample, Timeline, TimelineStats,
};
#[cfg(feature = "train")]
pub use measure::{DeviceMemoryMetric, MemoryQuantity};
#[cfg(feature = "plot")]
pub use measure::{PlotFormat, register_plot_font};
pub use params::{detach_params, draw_params};
pub use placement::{DeviceTransfer, MapLayer, Placed, Placement, ToDevice};
pub use training::{
    BatchSearchResult, BatchSizeSearch, BatchSizeSearchConfig, BatchTrial, BatchTrialFailure,
    BatchTrialOutcome, Checkpointing, LossScale, MemoryBudget, MixedPrecision,
    MixedPrecisionConfig, MixedPrecisionRecord, Precision, SegmentSeeds, SegmentState,
    SegmentedGrads, Segments, SharedMixedPrecision, StepOutcome, WithAutodiff, segmented_backward,
};

/// The crate README's example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
