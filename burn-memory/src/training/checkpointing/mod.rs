//! Gradient checkpointing: keep fewer activations for the backward pass and recompute the
//! rest, trading compute for memory. Two ways, for two kinds of model:
//!
//! - [`Checkpointing`] picks Burn's own autodiff checkpointing strategy for a training job
//!   (operations marked memory-bound are recomputed); nothing in the model changes.
//! - [`segmented_backward`] is segment checkpointing (PyTorch's `checkpoint_sequential`) for a
//!   model that implements [`Layers`](crate::Layers): only each segment's input is kept, and the backward pass
//!   re-runs one segment at a time, with the first pass's dropout masks ([`SegmentSeeds`]).

pub mod segments;
pub mod strategy;

pub use segments::{SegmentSeeds, SegmentState, SegmentedGrads, Segments, segmented_backward};
pub use strategy::{Checkpointing, WithAutodiff};
