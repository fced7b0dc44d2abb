//! [`MemoryCap`]: a per-device memory limit, checked before and measured around work.

use std::fmt;

use crate::{Bytes, DeviceMemory, MemoryError, MemoryReport, MemoryTracker, MemoryUsage};

/// A hard per-device memory limit for a serving loop: work that would pass it fails with
/// [`MemoryError::OverCap`] instead of running the device out of memory.
///
/// Neither Burn 0.21 nor CubeCL 0.10 can cap a device's total memory (CubeCL's
/// `MemoryConfiguration` picks pool layouts; its one size check is per allocation), so the cap
/// is **checked**, in two ways:
///
/// - [`reserve`](Self::reserve)`(bytes)`, before work runs: one read of the bytes in use (no
///   sync, so cheap enough per batch), and [`MemoryError::OverCap`] when in use plus `bytes`
///   passes the limit. [`check`](Self::check) is `reserve(0)`. This stops a batch whose
///   known size (its input, its output, an estimate of its activations) does not fit.
/// - [`run`](Self::run)`(f)`, around work: runs `f` under a [`MemoryTracker`] and fails when
///   the measured peak passed the limit. The work has run: the error says it did not fit,
///   so that the caller lowers the batch or the chunk size before the next. Use it to size a
///   batch once, not per batch: it resets the peak, which returns the pools' cached pages
///   (the next allocations ask the device again).
///
/// What is **not** enforced: an allocation made inside running work is not stopped mid-flight
/// (no allocator hook exists in Burn or CubeCL, and a refusing global allocator can only
/// abort the process), so a forward larger than `reserve` assumed still runs to its end.
///
/// The figures are those of [`DeviceMemory`]: on CubeCL devices the bytes in use in the
/// calling thread's memory pools (and [`run`](Self::run)'s peak is the reserved peak, an upper
/// bound); on CPU backends the process's heap bytes in use with a
/// [`CountingAllocator`](crate::CountingAllocator) (the whole process's), otherwise its
/// resident memory.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use burn_memory::{MemoryCap, MemoryError, MemoryTracker};
///
/// let device = Default::default();
/// let in_use = MemoryTracker::<Flex>::new(&device).usage()?.in_use;
/// let cap = MemoryCap::<Flex>::new(&device, in_use + (64 << 20));
/// // A batch of 1 GiB does not fit in 64 MiB more: refused before anything is allocated.
/// assert!(matches!(cap.reserve(1 << 30), Err(MemoryError::OverCap { .. })));
/// // A closure that allocates 256 KiB runs, and its peak is reported.
/// let (sum, report) = cap.run(|| Tensor::<Flex, 2>::ones([256, 256], &device).sum().into_scalar())?;
/// assert_eq!(sum, 65536.0);
/// assert!(report.peak <= cap.limit());
/// # Ok::<(), MemoryError>(())
/// ```
pub struct MemoryCap<B: DeviceMemory> {
    tracker: MemoryTracker<B>,
    limit: u64,
}

impl<B: DeviceMemory> Clone for MemoryCap<B> {
    fn clone(&self) -> Self {
        Self {
            tracker: self.tracker.clone(),
            limit: self.limit,
        }
    }
}

impl<B: DeviceMemory> fmt::Debug for MemoryCap<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryCap")
            .field("device", self.tracker.device())
            .field("limit", &Bytes(self.limit))
            .finish()
    }
}

impl<B: DeviceMemory> MemoryCap<B> {
    /// A cap of `limit` bytes on `device`, for the calling thread's stream (the thread that
    /// runs the model: CubeCL gives each thread its own memory pools).
    pub fn new(device: &B::Device, limit: u64) -> Self {
        Self {
            tracker: MemoryTracker::new(device),
            limit,
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The capped device.
    pub fn device(&self) -> &B::Device {
        self.tracker.device()
    }

    /// Fails with [`MemoryError::OverCap`] when the bytes in use already pass the limit;
    /// returns the usage read otherwise.
    pub fn check(&self) -> Result<MemoryUsage, MemoryError> {
        self.reserve(0)
    }

    /// Fails with [`MemoryError::OverCap`] when the bytes in use plus `bytes` (what the next
    /// piece of work will allocate) pass the limit; returns the usage read otherwise. One read
    /// of the device's counters, without waiting for queued work: on CubeCL the pools count an
    /// allocation when its work is submitted, so queued work is included.
    pub fn reserve(&self, bytes: u64) -> Result<MemoryUsage, MemoryError> {
        let usage = self.tracker.sample()?;
        let needed = usage.in_use.saturating_add(bytes);
        if needed > self.limit {
            tracing::warn!(
                "memory cap: {} in use + {} asked > limit {}",
                Bytes(usage.in_use),
                Bytes(bytes),
                Bytes(self.limit)
            );
            return Err(MemoryError::OverCap {
                limit: self.limit,
                needed,
                in_use: usage.in_use,
                what: format!("{} asked for were refused before running", Bytes(bytes)),
            });
        }
        Ok(usage)
    }

    /// Runs `f` under a [`MemoryTracker`] and returns its output with the report, or fails with
    /// [`MemoryError::OverCap`] (dropping the output) when the measured peak passed the limit.
    /// The peak is [`MemoryReport::peak`]: the reserved peak on CubeCL devices, the heap peak
    /// (with a `CountingAllocator`) on CPU backends, both absolute (what was in use before
    /// counts).
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<(T, MemoryReport), MemoryError> {
        let (output, report) = self.tracker.profile(f)?;
        if report.peak > self.limit {
            tracing::warn!(
                "memory cap: peak {} > limit {}",
                Bytes(report.peak),
                Bytes(self.limit)
            );
            return Err(MemoryError::OverCap {
                limit: self.limit,
                needed: report.peak,
                in_use: report.before.in_use,
                what: "the work ran and its measured peak passed the limit: lower its size"
                    .to_string(),
            });
        }
        Ok((output, report))
    }
}
