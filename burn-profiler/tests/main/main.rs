//! burn-profiler's integration tests: one binary (each test binary links all of Burn again).
//!
//! The binary runs on `CountingAllocator`, as the examples do, so that CPU profiles carry
//! exact heap bytes and the allocation log.

use burn_memory::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::system();

#[path = "../../../testing/own_process.rs"]
mod own_process;
mod profile;
mod profile_memory;
mod profile_viewer;

/// The wgpu device is shared by the whole binary.
mod wgpu {
    use std::sync::{Mutex, MutexGuard};

    /// Tests that measure the default wgpu device hold this lock: its figures are the whole
    /// device's.
    static DEVICE: Mutex<()> = Mutex::new(());

    pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
        DEVICE.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}
