//! Peak memory of one operation, through burn-memory's tracker.
//!
//! The figure is how far the device's peak rose above what was in use before the operation
//! (`MemoryReport::peak_increase`): on CPU backends the process's resident high-water mark, on
//! CubeCL backends the pools' reserved peak (see `MemoryTracker`'s docs for the accuracy of
//! each). Memory freed by earlier measurements must go back to the system first, or the next
//! operation would reuse it without raising the peak: the tracker's reset cleans CubeCL's
//! pools, and `mi_collect` hands mimalloc's cached pages back on CPU.

use burn_memory::{DeviceMemory, MemoryTracker};

/// Bytes the peak rose by while `op` ran once (after one untimed run, so that lazy
/// initialisation and autotuning are not counted).
pub fn peak_increase<B: DeviceMemory>(device: &B::Device, mut op: impl FnMut()) -> u64 {
    op();
    let tracker = MemoryTracker::<B>::new(device);
    release_cached_memory();
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

/// Returns the memory mimalloc keeps for reuse to the operating system.
fn release_cached_memory() {
    // SAFETY: `mi_collect` only walks mimalloc's own heaps; it is safe to call at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}
