//! [`MemoryCap`]: a per-device memory limit, checked before and measured around work.

use std::fmt;

use crate::{Bytes, DeviceMemory, MemoryError, MemoryReport, MemoryTracker, MemoryUsage};

/// A per-device memory limit for a serving loop: work that would pass it fails with
/// [`MemoryError::OverCap`] instead of running the device out of memory.
///
/// Neither Burn 0.21 nor CubeCL 0.10 can cap a device's total memory, so the cap is checked:
/// [`reserve`](Self::reserve) before work (one read of the bytes in use, cheap enough per
/// batch), [`run`](Self::run) around it (the measured peak; to size a batch once, not per
/// batch). An allocation inside running work is not stopped: nothing in Burn or CubeCL can
/// refuse one. The figures are [`DeviceMemory`]'s. Example, and what is enforced: the book's
/// chapter on chunked inference, "A memory cap".
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
