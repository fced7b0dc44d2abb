//! burn-data-parallel's integration tests: one binary (each test binary links all of Burn
//! again), one module per concern.
//!
//! - `gradients`: threads as peers of one process, their mean gradients against one device on
//!   the whole batch, and the replica check;
//! - `learner`: burn-train's learner with `DataParallel` against a one-device loop, on Flex,
//!   NdArray and wgpu, with and without mixed precision;
//! - `faults`: a peer that stops, a peer that panics, layouts refused;
//! - `mpi_jobs`: MPI jobs of two and three processes on loopback under `mpirun` (the same
//!   checks, mixed precision's skip, a killed rank);
//! - `fixture`: the model, data and comparisons they share.

mod faults;
mod fixture;
mod gradients;
mod learner;
mod mpi_jobs;
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
