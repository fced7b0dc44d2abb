//! Saving memory in training: the same step in fewer bytes.
//!
//! - [`checkpointing`]: keep fewer activations and recompute them in the backward pass, either
//!   through Burn's autodiff strategy ([`Checkpointing`]) or by segments of a layer sequence
//!   ([`segmented_backward`]).
//! - [`MixedPrecision`]: a half-precision forward and backward over f32 master weights, with
//!   dynamic loss scaling; [`SharedMixedPrecision`] keeps its state inside a model, so that
//!   checkpoints save it.
//! - [`BatchSizeSearch`]: the largest batch whose whole training step fits a memory budget.
//!
//! The hooks through which data-parallel training reaches mixed precision are in
//! [`hooks`](crate::hooks).

pub mod batch_search;
pub mod checkpointing;
pub mod mixed_precision;
mod shared_mixed_precision;

pub use batch_search::{
    BatchSearchResult, BatchSizeSearch, BatchSizeSearchConfig, BatchTrial, BatchTrialFailure,
    BatchTrialOutcome, MemoryBudget,
};
pub use checkpointing::{
    Checkpointing, SegmentSeeds, SegmentState, SegmentedGrads, Segments, WithAutodiff,
    segmented_backward,
};
pub use mixed_precision::{
    LossScale, MixedPrecision, MixedPrecisionConfig, MixedPrecisionRecord, Precision, StepOutcome,
};
pub use shared_mixed_precision::SharedMixedPrecision;
