//! Serving models and inputs larger than the device.
//!
//! - [`chunked_forward`]: inference over an input too large for one pass, in chunks, with
//!   bounded memory.
//! - [`offload`]: tiered parameter offloading (device, host, compressed disk cache) with a
//!   learned-order prefetcher, for models larger than the device.

mod chunked;
pub mod offload;

pub use chunked::chunked_forward;
