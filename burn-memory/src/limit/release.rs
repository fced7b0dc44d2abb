//! [`release_cached`]: the allocator's cached blocks back to the device, `empty_cache`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Bytes, DeviceMemory, MemoryError, MemorySource, MemoryUsage};

/// What [`release_cached`] gave back: the device's memory before and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReleased {
    /// Memory before the release, after all submitted work ran.
    pub before: MemoryUsage,
    /// Memory after the release.
    pub after: MemoryUsage,
}

impl MemoryReleased {
    /// Reserved bytes given back (0 when reserved grew meanwhile, which on CPU backends
    /// another thread's allocations can do).
    pub fn released(&self) -> u64 {
        self.before.reserved.saturating_sub(self.after.reserved)
    }
}

impl fmt::Display for MemoryReleased {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reserved {} -> {} ({} released); in use {} -> {}",
            Bytes(self.before.reserved),
            Bytes(self.after.reserved),
            Bytes(self.released()),
            Bytes(self.before.in_use),
            Bytes(self.after.in_use),
        )
    }
}

/// Returns the memory the allocator keeps cached for reuse, as `torch.cuda.empty_cache` does,
/// and reports reserved bytes before and after; live tensors keep theirs.
///
/// On CubeCL backends it waits for the device and calls Burn's `Backend::memory_cleanup`; on CPU
/// backends with glibc's allocator (the Rust default on Linux, also under
/// [`CountingAllocator::system`](crate::CountingAllocator::system)) it calls `malloc_trim(0)`.
/// Other global allocators (mimalloc, jemalloc) keep caches it does not reach. The next
/// allocations ask the device or the kernel again: call it between phases, not per batch. More
/// in the book's chapter on chunked inference, "Releasing cached memory".
pub fn release_cached<B: DeviceMemory>(device: &B::Device) -> Result<MemoryReleased, MemoryError> {
    let stream = B::current_stream();
    let sync = || B::sync(device).map_err(|error| MemoryError::Backend(format!("{error:?}")));
    sync()?;
    let before = B::memory_usage(device, stream)?;
    B::memory_cleanup(device);
    if B::SOURCE == MemorySource::Process {
        trim_heap();
    }
    sync()?;
    let after = B::memory_usage(device, stream)?;
    let released = MemoryReleased { before, after };
    tracing::debug!("release_cached: {released}");
    Ok(released)
}

/// Returns glibc's free heap pages to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    unsafe extern "C" {
        /// glibc's `int malloc_trim(size_t pad)` (`malloc.h`).
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: `malloc_trim` takes a byte count and only releases free memory; it is safe to
    // call at any time from any thread.
    let trimmed = unsafe { malloc_trim(0) };
    tracing::trace!(
        "malloc_trim: {}",
        if trimmed == 1 { "released" } else { "nothing" }
    );
}

/// Other C libraries have no portable call that releases the heap's free pages.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}
