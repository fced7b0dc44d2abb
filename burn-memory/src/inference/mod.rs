//! Serving models and inputs larger than the device.
//!
//! - [`chunked_forward`]: inference over an input too large for one pass, in chunks, with
//!   bounded memory.
//! - [`StreamingForward`] ([`stream_forward`]): inference over host data, uploaded and read
//!   back one chunk at a time, so that neither the input nor the output is on the device
//!   whole.
//! - [`offload`]: tiered parameter offloading (device, host, compressed disk cache) with a
//!   learned-order prefetcher, for models larger than the device.

mod chunked;
pub mod offload;
mod streaming;

pub use chunked::chunked_forward;
pub use streaming::{Streamed, StreamingForward, prefetch, stream_forward};
