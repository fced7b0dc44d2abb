//! burn-data-parallel's integration tests: one binary (each test binary links all of Burn
//! again).

mod distributed;
#[path = "../../../testing/own_process.rs"]
mod own_process;

/// The wgpu device is shared by the whole binary.
mod wgpu {
    use std::sync::{Mutex, MutexGuard};

    /// Tests that train on the default wgpu device hold this lock.
    static DEVICE: Mutex<()> = Mutex::new(());

    pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
        DEVICE.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}
