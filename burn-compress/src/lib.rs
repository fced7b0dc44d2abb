//! Smaller, faster models from Burn models: linear layers whose kind (dense, low-rank,
//! sketched, `int8`) is chosen at run time, attention and transformer blocks built on them,
//! the conversion of a trained model's layers, the search for the smallest sketch that keeps
//! its quality, and pruning. The layers themselves are burn-sketch's and burn-cpu-kernels'.
//!
//! - [`AnyLinear`]: one linear layer of a kind chosen at run time ([`LinearKind`]);
//!   [`LowRankLinear`]: `x·A·B + b`; [`Int8Linear`]: a trained layer with `int8` weights.
//! - [`AnyMultiHeadAttention`]: softmax attention over `AnyLinear` projections;
//!   [`PerformerAttention`]: its linear-time approximation (Panther's
//!   `RandMultiHeadAttention`, FAVOR+, checkpoints read by [`load_performer`]);
//!   [`TransformerBlock`]: a pre-norm block of either attention and an [`Mlp`].
//! - [`Converter`]: converts the layers a [`Selection`] picks in any model built from
//!   `AnyLinear`s, reporting parameters and stored bytes ([`ConversionReport`],
//!   [`stored_bytes`]).
//! - [`rank_search`]: [`RankSearch`] finds each layer group's cheapest `(num_terms, low_rank)`
//!   whose quality passes (Panther's `SKAutoTuner`; not CubeCL's kernel autotuning).
//! - [`prune`]: magnitude and structured pruning, masks, shrinking.
//! - [`distil`]: train a converted model to reproduce the original's hidden states
//!   ([`Distillable`], [`DistilConfig`]), the fine-tuning that recovers what a conversion lost.
//! - [`CompressError`]: every error of the crate.
//!
//! Burn draws a parameter on its first use: call `burn_memory::draw_params` on a freshly built
//! model before cloning it when the clone must hold the same weights.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_compress::{Converter, LinearKind, Selection, TransformerBlockConfig};
//!
//! let device = Default::default();
//! // A causal pre-norm block, dense; then its MLP sketched as T = 1, k = 8.
//! let block = TransformerBlockConfig::new(64, 4, 256).init::<Flex>(&device);
//! let sketched = LinearKind::Sketched { num_terms: 1, low_rank: 8 };
//! let (block, report) = Converter::new()
//!     .rule(Selection::types(["Mlp"]), sketched)
//!     .apply(block)
//!     .unwrap();
//! assert_eq!(report.layers.len(), 2);
//! let x = Tensor::<Flex, 3>::random([2, 16, 64], Distribution::Default, &device);
//! assert_eq!(block.forward(x, None).dims(), [2, 16, 64]);
//! ```

mod any_linear;
mod attention;
mod block;
mod convert;
mod distil;
mod error;
mod int8;
mod low_rank;
mod panther_performer;
mod performer;
pub mod prune;
pub mod rank_search;

pub use any_linear::{AnyLinear, AnyLinearConfig, LinearKind, LinearLayer};
pub use attention::{AnyMultiHeadAttention, AnyMultiHeadAttentionConfig};
pub use block::{
    AttentionKind, BlockAttention, Mlp, MlpConfig, TransformerBlock, TransformerBlockConfig,
};
pub use convert::{
    ConversionReport, ConvertedLayer, Converter, LayerInfo, Selection, stored_bytes,
};
pub use distil::{
    DistilConfig, DistilInput, DistilLoss, DistilReport, DistilStates, DistilStep, Distillable,
    distil, output_cosine,
};
pub use error::CompressError;
pub use int8::Int8Linear;
pub use low_rank::{LowRankLinear, LowRankLinearConfig};
pub use panther_performer::{load_performer, load_performer_from_bytes};
pub use performer::{FeatureMap, PerformerAttention, PerformerAttentionConfig};
pub use rank_search::{
    Cost, CostMetric, Evaluation, GroupResult, LayerGroup, Measure, RankSearch, Search,
    SearchOutcome, SearchReport, SketchSize, Threshold, Trial,
};

/// The crate README's example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
