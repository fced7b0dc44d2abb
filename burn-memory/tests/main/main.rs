//! burn-memory's integration tests: one binary (each test binary links all of Burn again),
//! one module per backend or tool.
//!
//! The binary runs on `CountingAllocator`, as the examples and the bench do, so the CPU
//! figures are exact heap bytes; the resident-memory fallback is covered by the library's
//! unit tests, which install no allocator.

use burn_memory::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::system();

mod batch_search;
mod flex;
mod heap;
mod limit;
mod mixed_precision;
mod ndarray;
mod offload;
#[path = "../../../testing/own_process.rs"]
mod own_process;
mod placement;
mod segments;
mod streaming;
mod threads;
mod wgpu;
