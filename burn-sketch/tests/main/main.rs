//! burn-sketch's integration tests: one binary (each test binary links all of Burn again),
//! one module per backend, sharing the backend-generic checks of `common`.

#[macro_use]
mod common;
mod autotune;
mod bad_input;
mod conv;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod finite_differences;
mod flex;
mod half_flex;
mod linalg;
mod ndarray;
#[path = "../../../testing/own_process.rs"]
mod own_process;
mod performer;
mod placement;
mod profiled;
mod prune;
mod seeded;
mod transformer;
mod wgpu;
