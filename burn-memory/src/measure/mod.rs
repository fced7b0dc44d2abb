//! Measuring memory: how much a device holds, how it moves over a run, and where it peaks.
//!
//! - [`DeviceMemory`] reads a backend's memory: the heap for NdArray and Flex (exact when a
//!   [`CountingAllocator`] is the global allocator, otherwise the process's resident memory),
//!   CubeCL's memory pools for `Wgpu` and `Cuda`, through their fusion wrappers and `Autodiff`.
//! - [`MemoryTracker`] turns those readings into [`MemoryReport`]s: in use, reserved and peak
//!   around a closure ([`MemoryTracker::profile`]).
//! - [`MemoryMonitor`] samples a device on a background thread into a [`Timeline`] with
//!   labelled [`Phase`]s, written as CSV and, with the `plot` feature, plotted (PNG or SVG).
//! - With the `train` feature, [`DeviceMemoryMetric`] puts device memory on burn-train's
//!   dashboard.
//! - [`process`]: the process's resident memory. The allocation log of [`CountingAllocator`],
//!   which burn-profiler starts, is in [`hooks`](crate::hooks).

#[cfg(feature = "wgpu")]
mod available;
mod device;
pub(crate) mod heap;
#[cfg(feature = "train")]
mod metric;
mod monitor;
#[cfg(feature = "plot")]
pub(crate) mod plot;
pub mod process;
mod tracker;
mod usage;

#[cfg(feature = "wgpu")]
pub use available::wgpu_adapter;
pub use device::{DeviceMemory, MemorySource, MemoryStream};
pub use heap::CountingAllocator;
#[cfg(feature = "train")]
pub use metric::{DeviceMemoryMetric, MemoryQuantity};
pub use monitor::{MemoryMonitor, Phase, Sample, Timeline, TimelineStats};
#[cfg(feature = "plot")]
pub use plot::{PlotFormat, register_plot_font};
pub use tracker::{MemoryReport, MemoryTracker};
pub use usage::{Bytes, MemoryUsage};
