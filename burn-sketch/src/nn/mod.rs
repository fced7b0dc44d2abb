//! Transformer building blocks whose linear layers are dense, sketched or low-rank, and the
//! tools that move a trained dense model to sketched layers.
//!
//! - [`AnyLinear`]: one linear layer of a kind chosen at run time ([`LinearKind`]).
//! - [`LowRankLinear`]: `x·A·B + b`, the baseline a sketched layer must beat at equal size.
//! - [`MultiHeadAttention`]: softmax attention (causal or not, padding mask) over `AnyLinear`
//!   projections; [`TransformerBlock`]: a pre-norm block of attention and an [`Mlp`].
//! - [`Converter`]: sketches the layers a [`Selection`] picks in any model built from
//!   `AnyLinear`s.

mod any_linear;
mod attention;
mod autotune;
mod block;
mod convert;
mod low_rank;
mod performer;

pub use any_linear::{AnyLinear, AnyLinearConfig, LinearKind, LinearLayer};
pub use attention::{MultiHeadAttention, MultiHeadAttentionConfig};
pub use autotune::{
    AutoTuner, Cost, CostMetric, Evaluation, GroupResult, LayerGroup, Measure, Search, SketchSize,
    Threshold, Trial, TuneOutcome, TuneReport,
};
pub use block::{
    AttentionKind, BlockAttention, Mlp, MlpConfig, TransformerBlock, TransformerBlockConfig,
};
pub use convert::{ConversionReport, ConvertedLayer, Converter, LayerInfo, Selection};
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
