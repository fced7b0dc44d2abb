//! `MemoryTracker`: in use, reserved and peak on one device, and `profile`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::{Bytes, DeviceMemory, MemoryError, MemoryUsage};
use crate::{MemorySource, MemoryStream};

/// Memory figures of one device, with a peak since the last reset: Burn's counterpart of
/// `torch.cuda.memory_allocated`, `memory_reserved`, `max_memory_allocated` and
/// `reset_peak_memory_stats`.
///
/// The peak is exact on CPU backends with a [`CountingAllocator`](crate::CountingAllocator), the
/// kernel's page-level high-water mark without one (Linux), and sampled on CubeCL backends,
/// which keep none: there [`MemoryReport::peak`] (the reserved peak) is an upper bound and the
/// sampled in-use peak a lower one. How each is obtained: the book's chapter "How much memory
/// does my step use?".
pub struct MemoryTracker<B: DeviceMemory> {
    device: B::Device,
    stream: MemoryStream,
    peaks: Arc<Mutex<MemoryUsage>>,
    _backend: PhantomData<B>,
}

impl<B: DeviceMemory> Clone for MemoryTracker<B> {
    fn clone(&self) -> Self {
        Self {
            device: self.device.clone(),
            stream: self.stream,
            peaks: self.peaks.clone(),
            _backend: PhantomData,
        }
    }
}

impl<B: DeviceMemory> fmt::Debug for MemoryTracker<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTracker")
            .field("device", &self.device)
            .field("peaks", &*self.lock())
            .finish()
    }
}

/// What a [`MemoryTracker::profile`]d closure did to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Memory before the closure ran (after a sync).
    pub before: MemoryUsage,
    /// Memory after the closure returned (after a sync).
    pub after: MemoryUsage,
    /// The peak while it ran, in the sense of [`MemoryTracker`]'s docs: the reserved peak on
    /// CubeCL devices, the heap peak (with a `CountingAllocator`) or resident peak on CPU
    /// backends.
    pub peak: u64,
    /// The largest in-use figure sampled while it ran (a lower bound of the true in-use peak).
    pub peak_in_use_sampled: u64,
}

impl MemoryReport {
    /// How far the peak rose above the memory in use before the closure: what the closure
    /// needed on top of what was already there.
    pub fn peak_increase(&self) -> u64 {
        self.peak.saturating_sub(self.before.in_use)
    }

    /// Memory in use after the closure minus before (negative when it freed memory).
    pub fn retained(&self) -> i64 {
        self.after.in_use as i64 - self.before.in_use as i64
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let retained = self.retained();
        let sign = if retained < 0 { "-" } else { "+" };
        write!(
            f,
            "before {}; after {} ({sign}{}); peak {} (+{} over before)",
            Bytes(self.before.in_use),
            Bytes(self.after.in_use),
            Bytes(retained.unsigned_abs()),
            Bytes(self.peak),
            Bytes(self.peak_increase()),
        )
    }
}

impl<B: DeviceMemory> MemoryTracker<B> {
    /// A tracker of `device` whose peak starts at the current usage. It reports the memory of
    /// the calling thread's stream (the thread that runs the model), also when it is read from
    /// another thread.
    pub fn new(device: &B::Device) -> Self {
        let tracker = Self {
            device: device.clone(),
            stream: B::current_stream(),
            peaks: Arc::new(Mutex::new(MemoryUsage::default())),
            _backend: PhantomData,
        };
        if let Err(error) = tracker.reset_peak() {
            tracing::warn!("memory tracker: cannot read device memory: {error}");
        }
        tracker
    }

    /// The tracked device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Memory in use and reserved now, after the device has run all submitted work. Also a
    /// peak sample.
    pub fn usage(&self) -> Result<MemoryUsage, MemoryError> {
        B::sync(&self.device).map_err(|error| MemoryError::Backend(format!("{error:?}")))?;
        self.sample()
    }

    /// Reads the device without waiting for queued work and records it as a peak sample: what
    /// [`MemoryMonitor`](crate::MemoryMonitor) calls from its thread.
    pub fn sample(&self) -> Result<MemoryUsage, MemoryError> {
        let usage = B::memory_usage(&self.device, self.stream)?;
        let mut peaks = self.lock();
        peaks.in_use = peaks.in_use.max(usage.in_use);
        peaks.reserved = peaks.reserved.max(usage.reserved);
        Ok(usage)
    }

    /// The peak since the last reset (see the type's docs for how it is obtained): the
    /// resident peak on CPU backends, the reserved peak on CubeCL devices.
    pub fn peak(&self) -> Result<u64, MemoryError> {
        self.usage()?;
        Ok(self.current_peak())
    }

    /// The peak as of the samples taken so far, without waiting for the device.
    pub fn current_peak(&self) -> u64 {
        let peaks = *self.lock();
        match B::SOURCE {
            MemorySource::Process => match crate::measure::heap::counts() {
                Some((_, heap_peak)) => heap_peak.max(peaks.in_use),
                None => crate::measure::process::peak_resident_bytes()
                    .map_or(peaks.reserved, |kernel| kernel.max(peaks.reserved)),
            },
            MemorySource::DevicePools => peaks.reserved,
        }
    }

    /// The largest in-use figure sampled since the last reset.
    pub fn peak_in_use_sampled(&self) -> u64 {
        self.lock().in_use
    }

    /// Starts a new peak period: waits for the device, returns the pools' cached free pages to
    /// the device (CubeCL) or resets the kernel's high-water mark (CPU), and sets the peak to the
    /// current usage.
    pub fn reset_peak(&self) -> Result<(), MemoryError> {
        B::sync(&self.device).map_err(|error| MemoryError::Backend(format!("{error:?}")))?;
        B::memory_cleanup(&self.device);
        B::sync(&self.device).map_err(|error| MemoryError::Backend(format!("{error:?}")))?;
        if B::SOURCE == MemorySource::Process {
            crate::measure::process::reset_peak();
            crate::measure::heap::reset_peak();
        }
        let usage = B::memory_usage(&self.device, self.stream)?;
        *self.lock() = usage;
        Ok(())
    }

    /// Runs `f` between a peak reset and a sync, and reports memory before, after and at the
    /// peak. Memory still held by the closure's result counts as `after`.
    pub fn profile<T>(&self, f: impl FnOnce() -> T) -> Result<(T, MemoryReport), MemoryError> {
        self.reset_peak()?;
        let before = self.usage()?;
        let output = f();
        let after = self.usage()?;
        let report = MemoryReport {
            before,
            after,
            peak: self.peak()?,
            peak_in_use_sampled: self.peak_in_use_sampled(),
        };
        Ok((output, report))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryUsage> {
        crate::sync::lock(&self.peaks)
    }
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use burn::backend::NdArray;
    use burn::tensor::{Distribution, Tensor};

    use super::MemoryTracker;

    /// Without a `CountingAllocator` (this unit-test binary installs none), the tracker on
    /// NdArray reads the process's resident memory, whose peak sees a touched transient. In its
    /// own process: other tests allocating or freeing meanwhile move the resident figure.
    #[test]
    fn tracker_reports_resident_memory_without_a_counting_allocator() {
        crate::own_process::in_own_process(
            "measure::tracker::tests::tracker_reports_resident_memory_without_a_counting_allocator",
            resident_peak_sees_a_transient,
        );
    }

    fn resident_peak_sees_a_transient() {
        assert!(!crate::CountingAllocator::is_installed());
        let device = Default::default();
        let tracker = MemoryTracker::<NdArray>::new(&device);
        // 64 MiB of random f32, every page touched.
        let (sum, report) = tracker
            .profile(|| {
                let x = Tensor::<NdArray, 2>::random(
                    [4096, 4096],
                    Distribution::Uniform(0.0, 1.0),
                    &device,
                );
                x.sum().into_scalar()
            })
            .unwrap();
        assert!(sum > 0.0);
        assert!(
            crate::measure::heap::counts().is_none(),
            "no counting allocator here"
        );
        assert!(
            report.peak >= report.before.in_use + 60 * 1024 * 1024,
            "the 64 MiB transient is missing from the peak: {report}"
        );
    }
}
