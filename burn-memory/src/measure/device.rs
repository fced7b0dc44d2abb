//! Where each backend's memory figures come from.
//!
//! Burn 0.21's `Backend` trait has no memory query, so this crate adds one, [`DeviceMemory`],
//! implemented beside it for every backend family (Rust's orphan rule puts them here):
//! NdArray and Flex report the process, CubeCL backends (`Wgpu`, `Cuda`) their memory pools, and the
//! `Fusion` and `Autodiff` wrappers the backend they wrap.

use burn::tensor::backend::Backend;

use crate::{MemoryError, MemoryUsage};

/// Where a backend's tensors live, which decides how the peak is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// In this process's heap (CPU backends): figures are the process's resident memory.
    Process,
    /// In memory pools on a device (CubeCL backends): figures are the pools'.
    DevicePools,
}

/// The execution stream whose memory is read. CubeCL 0.10 gives each thread its own stream
/// with its own memory pools, so a reading taken on another thread (a monitor's) must name the
/// stream of the thread that runs the model; trackers capture it when they are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStream(pub(crate) u64);

/// A backend whose device memory can be read.
///
/// On `Wgpu`, the first query is a first use of the device: without a graphics adapter CubeCL
/// panics on its device thread. Check with `burn_memory::wgpu_adapter()` first where
/// no driver may be installed.
pub trait DeviceMemory: Backend {
    /// Where this backend's tensors live.
    const SOURCE: MemorySource;

    /// The calling thread's stream.
    fn current_stream() -> MemoryStream {
        MemoryStream(0)
    }

    /// Memory in use and reserved on `device` by `stream`, as of the work submitted so far
    /// (call `Backend::sync` first to include queued lazy work; [`crate::MemoryTracker`] does).
    fn memory_usage(
        device: &Self::Device,
        stream: MemoryStream,
    ) -> Result<MemoryUsage, MemoryError>;

    /// The device's total memory, where the backend knows it: the machine's RAM for CPU
    /// backends and CUDA's `cuDeviceTotalMem` for CUDA; `None` for wgpu, which does not expose
    /// it.
    fn memory_capacity(device: &Self::Device) -> Option<u64>;
}

/// The process's memory, for CPU backends, whose tensors live on the heap: with a
/// `CountingAllocator`, in use is the exact heap figure and reserved is what the process holds
/// from the system (the allocator's caches included); without one, both are resident memory.
#[cfg(any(feature = "ndarray", feature = "flex"))]
fn process_usage() -> Result<MemoryUsage, MemoryError> {
    let resident = crate::measure::process::resident_bytes()?;
    let in_use = crate::measure::heap::counts().map_or(resident, |(heap, _)| heap);
    Ok(MemoryUsage {
        in_use,
        reserved: resident,
    })
}

#[cfg(feature = "ndarray")]
impl<E, I, Q> DeviceMemory for burn_ndarray::NdArray<E, I, Q>
where
    burn_ndarray::NdArrayTensor:
        From<burn_ndarray::SharedArray<E>> + From<burn_ndarray::SharedArray<I>>,
    Self: Backend,
{
    const SOURCE: MemorySource = MemorySource::Process;

    fn memory_usage(
        _device: &Self::Device,
        _stream: MemoryStream,
    ) -> Result<MemoryUsage, MemoryError> {
        process_usage()
    }

    fn memory_capacity(_device: &Self::Device) -> Option<u64> {
        Some(crate::measure::process::total_bytes())
    }
}

/// Flex, Burn's pure-Rust CPU backend, keeps its tensors on the heap as NdArray does.
#[cfg(feature = "flex")]
impl DeviceMemory for burn::backend::Flex {
    const SOURCE: MemorySource = MemorySource::Process;

    fn memory_usage(
        _device: &Self::Device,
        _stream: MemoryStream,
    ) -> Result<MemoryUsage, MemoryError> {
        process_usage()
    }

    fn memory_capacity(_device: &Self::Device) -> Option<u64> {
        Some(crate::measure::process::total_bytes())
    }
}

#[cfg(feature = "cubecl")]
impl<R, F, I, BT> DeviceMemory for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::BoolElement,
{
    const SOURCE: MemorySource = MemorySource::DevicePools;

    fn current_stream() -> MemoryStream {
        MemoryStream(burn_cubecl::cubecl::stream_id::StreamId::current().value)
    }

    fn memory_usage(
        device: &Self::Device,
        stream: MemoryStream,
    ) -> Result<MemoryUsage, MemoryError> {
        let mut client = R::client(device);
        // SAFETY: the stream only selects which stream's memory pools this client (a clone
        // used for this one query) reports; no work is submitted through it.
        unsafe { client.set_stream(burn_cubecl::cubecl::stream_id::StreamId { value: stream.0 }) };
        let usage = client
            .memory_usage()
            .map_err(|error| MemoryError::Backend(format!("{error:?}")))?;
        Ok(MemoryUsage {
            in_use: usage.bytes_in_use,
            reserved: usage.bytes_reserved,
        })
    }

    fn memory_capacity(device: &Self::Device) -> Option<u64> {
        use burn_cubecl::cubecl::Runtime;
        let client = R::client(device);
        // CubeCL 0.10 does not expose the device's size, but its CUDA runtime derives the
        // largest page from it: `max_page_size = cuDeviceTotalMem / 4` (cubecl-cuda's
        // `runtime.rs`). Other runtimes set the page size from unrelated limits.
        (<R as Runtime>::name(&client) == "cuda")
            .then(|| client.properties().memory.max_page_size * 4)
    }
}

#[cfg(feature = "fusion")]
impl<B> DeviceMemory for burn_fusion::Fusion<B>
where
    B: burn_fusion::FusionBackend + DeviceMemory,
{
    const SOURCE: MemorySource = B::SOURCE;

    fn current_stream() -> MemoryStream {
        B::current_stream()
    }

    fn memory_usage(
        device: &Self::Device,
        stream: MemoryStream,
    ) -> Result<MemoryUsage, MemoryError> {
        B::memory_usage(device, stream)
    }

    fn memory_capacity(device: &Self::Device) -> Option<u64> {
        B::memory_capacity(device)
    }
}

impl<B, C> DeviceMemory for burn::backend::Autodiff<B, C>
where
    B: DeviceMemory,
    C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy,
{
    const SOURCE: MemorySource = B::SOURCE;

    fn current_stream() -> MemoryStream {
        B::current_stream()
    }

    fn memory_usage(
        device: &Self::Device,
        stream: MemoryStream,
    ) -> Result<MemoryUsage, MemoryError> {
        B::memory_usage(device, stream)
    }

    fn memory_capacity(device: &Self::Device) -> Option<u64> {
        B::memory_capacity(device)
    }
}
