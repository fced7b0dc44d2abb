//! Keeping a serving process inside its memory.
//!
//! - [`release_cached`]: returns the allocator's cached free blocks to the device or the
//!   operating system, PyTorch's `torch.cuda.empty_cache`, and reports reserved bytes before
//!   and after ([`MemoryReleased`]).
//! - [`MemoryCap`]: a per-device memory limit checked before work runs
//!   ([`MemoryCap::reserve`], one usage read) or measured around it ([`MemoryCap::run`]),
//!   failing with [`MemoryError::OverCap`](crate::MemoryError::OverCap).
//!
//! Neither Burn 0.21 nor CubeCL 0.10 has a total memory limit: CubeCL's
//! `MemoryConfiguration` chooses pool layouts, and its only size check refuses one allocation
//! larger than the largest pool's pages (`BufferTooBig`), not a total. The cap is therefore a
//! checked limit, not a hardware one; its docs say what it does and does not stop.

mod cap;
mod release;

pub use cap::MemoryCap;
pub use release::{MemoryReleased, release_cached};
