//! Peak memory of one operation, through burn-memory's tracker.
//!
//! The figure is how far the device's peak rose above what was in use before the operation
//! (`MemoryReport::peak_increase`): on CPU backends the exact heap peak (the bench's global
//! allocator is burn-memory's `CountingAllocator`), on CubeCL backends the pools' reserved
//! peak, after the tracker's reset has handed the pools' cached pages back (see
//! `MemoryTracker`'s docs for the accuracy of each).

use burn_memory::{DeviceMemory, MemoryTracker};

/// Bytes the peak rose by while `op` ran once (after one untimed run, so that lazy
/// initialisation and autotuning are not counted).
pub fn peak_increase<B: DeviceMemory>(device: &B::Device, mut op: impl FnMut()) -> u64 {
    op();
    let tracker = MemoryTracker::<B>::new(device);
    if let Err(err) = tracker.reset_peak() {
        eprintln!("memory: cannot reset the peak ({err}); the figure may be low");
    }
    match tracker.profile(&mut op) {
        Ok(((), report)) => report.peak_increase(),
        Err(err) => {
            eprintln!("memory: cannot read device memory ({err})");
            0
        }
    }
}
