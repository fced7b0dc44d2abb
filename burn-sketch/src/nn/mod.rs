//! Transformer building blocks whose linear layers are dense, sketched or low-rank, and the
//! tools that move a trained dense model to sketched layers.
//!
//! - [`AnyLinear`]: one linear layer of a kind chosen at run time ([`LinearKind`]).
//! - [`LowRankLinear`]: `x·A·B + b`, the baseline a sketched layer must beat at equal size.
//! - [`AnyMultiHeadAttention`]: softmax attention (causal or not, padding mask) over `AnyLinear`
//!   projections; [`PerformerAttention`]: its linear-time approximation (Panther's
//!   `RandMultiHeadAttention`, FAVOR+); [`TransformerBlock`]: a pre-norm block of either
//!   attention and an [`Mlp`].
//! - [`Int8Linear`]: a trained dense or sketched layer with `int8` weights, for inference.
//! - [`Converter`]: sketches (or quantizes to `int8`) the layers a [`Selection`] picks in any
//!   model built from `AnyLinear`s, reporting parameters and stored bytes; [`AutoTuner`]: searches each group's `(num_terms, low_rank)` for the cheapest
//!   one whose quality passes (Panther's `SKAutoTuner`).
//!
//! Burn draws a parameter on its first use, and a clone of a parameter not yet drawn draws
//! values of its own: call [`draw_params`] on a freshly built model before cloning it when the
//! clone must hold the same weights (a conversion compared against its original).
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_sketch::nn::{Converter, LinearKind, Selection, TransformerBlockConfig};
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
mod autotune;
mod block;
mod convert;
mod int8;
mod low_rank;
mod performer;

pub use any_linear::{AnyLinear, AnyLinearConfig, LinearKind, LinearLayer};
pub use attention::{AnyMultiHeadAttention, AnyMultiHeadAttentionConfig};
pub use autotune::{
    AutoTuner, Cost, CostMetric, Evaluation, GroupResult, LayerGroup, Measure, Search, SketchSize,
    Threshold, Trial, TuneOutcome, TuneReport,
};
pub use block::{
    AttentionKind, BlockAttention, Mlp, MlpConfig, TransformerBlock, TransformerBlockConfig,
};
pub use convert::{
    ConversionReport, ConvertedLayer, Converter, LayerInfo, Selection, stored_bytes,
};
pub use int8::Int8Linear;
pub use low_rank::{LowRankLinear, LowRankLinearConfig};
pub use performer::{FeatureMap, PerformerAttention, PerformerAttentionConfig};

/// Draws every lazily initialised parameter of `module` in place (Burn draws a parameter on
/// its first use, and a clone of an undrawn parameter draws values of its own): afterwards,
/// clones of `module` and copies of its layers hold its weights.
pub fn draw_params<B: burn::tensor::backend::Backend, M: burn::module::Module<B>>(module: &M) {
    struct Draw;
    impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Draw {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
        ) {
            let _ = param.val();
        }
    }
    module.visit(&mut Draw);
}
