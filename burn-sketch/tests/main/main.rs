//! burn-sketch's integration tests: one binary (each test binary links all of Burn again),
//! one module per backend, sharing the backend-generic checks of `common`.

#[path = "../../../testing/close.rs"]
mod close;
#[macro_use]
mod common;
mod bad_input;
mod conv;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod fast_flex;
mod finite_differences;
mod flex;
mod ndarray;
#[path = "../../../testing/own_process.rs"]
mod own_process;
mod placement;
mod profiled;
mod seeded;
mod wgpu;
