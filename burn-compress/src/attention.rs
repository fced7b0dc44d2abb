//! Multi-head softmax attention whose projections are [`AnyLinear`]s: dense, sketched or
//! low-rank, causal or not, with a padding mask.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Distribution, Int, Tensor};
use burn_fused::{AttentionDropout, AttentionOptions, fused_attention};

use super::{AnyLinear, AnyLinearConfig, LinearKind};
use burn_sketch::SketchBackend;

use crate::CompressError;

/// The score given to masked positions before the softmax: far below any real score, and
/// finite in f16 (whose largest value is 65,504), so that mixed precision masks as f32 does.
pub(crate) const MASKED_SCORE: f64 = -1.0e4;

/// Configuration of a [`AnyMultiHeadAttention`].
#[derive(Config, Debug)]
pub struct AnyMultiHeadAttentionConfig {
    /// The width of the model (queries, keys, values and output).
    pub d_model: usize,
    /// The number of heads; must divide `d_model`.
    pub n_heads: usize,
    /// Dropout on the attention weights, in training only.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// If each position attends only to itself and earlier positions.
    #[config(default = false)]
    pub causal: bool,
    /// The kind of the four projections (query, key, value, output).
    #[config(default = "LinearKind::Dense")]
    pub projections: LinearKind,
}

impl AnyMultiHeadAttentionConfig {
    /// Checks the sizes: `n_heads` at least 1 and dividing `d_model`.
    pub fn validate(&self) -> Result<(), CompressError> {
        if self.n_heads == 0 || !self.d_model.is_multiple_of(self.n_heads) {
            return Err(CompressError::InvalidConfig {
                name: "n_heads",
                value: self.n_heads,
                reason: "must be at least 1 and divide d_model",
            });
        }
        Ok(())
    }

    /// Initializes the module.
    ///
    /// # Panics
    /// On an invalid configuration; [`try_init`](Self::try_init) returns the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> AnyMultiHeadAttention<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise AnyMultiHeadAttention: {err}"))
    }

    /// [`init`](Self::init), or the error naming the bad value.
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<AnyMultiHeadAttention<B>, CompressError> {
        self.validate()?;
        let projection = || {
            AnyLinearConfig::new(self.d_model, self.d_model)
                .with_kind(self.projections)
                .try_init(device)
        };
        Ok(AnyMultiHeadAttention {
            query: projection()?,
            key: projection()?,
            value: projection()?,
            output: projection()?,
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: self.n_heads,
            causal: self.causal,
        })
    }
}

/// Multi-head scaled dot-product self-attention (Vaswani et al.):
/// `softmax(Q·Kᵀ/√d_k + mask)·V` per head, heads concatenated and projected.
///
/// The projections are [`AnyLinear`]s, so the module is dense, sketched or low-rank by
/// configuration, and a trained dense one can be sketched with a
/// [`Converter`](super::Converter).
#[derive(Module, Debug)]
pub struct AnyMultiHeadAttention<B: Backend> {
    /// Query projection, `[d_model, d_model]`.
    pub query: AnyLinear<B>,
    /// Key projection.
    pub key: AnyLinear<B>,
    /// Value projection.
    pub value: AnyLinear<B>,
    /// Output projection.
    pub output: AnyLinear<B>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// The number of heads.
    pub n_heads: usize,
    /// If the attention is causal.
    pub causal: bool,
}

impl<B: Backend> AnyMultiHeadAttention<B> {
    /// The module with the projections of Burn's own `nn::attention::MultiHeadAttention`
    /// (copied as dense layers), the same number of heads and dropout: it computes the same
    /// function as Burn's on self-attention (`MhaInput::self_attn`). Burn's module has no
    /// causal flag (it takes a mask per call): pass `causal` here.
    pub fn from_burn(mha: &burn::nn::attention::MultiHeadAttention<B>, causal: bool) -> Self {
        // Burn draws a parameter on first use, and a clone of an undrawn one draws its own:
        // draw `mha`'s now so that the copies hold its weights.
        burn_memory::draw_params(mha);
        Self {
            query: mha.query.clone().into(),
            key: mha.key.clone().into(),
            value: mha.value.clone().into(),
            output: mha.output.clone().into(),
            dropout: mha.dropout.clone(),
            n_heads: mha.n_heads,
            causal,
        }
    }

    /// The model width.
    pub fn d_model(&self) -> usize {
        self.query.d_input()
    }
}

impl<B: SketchBackend> AnyMultiHeadAttention<B> {
    /// Self-attention over `input`.
    ///
    /// # Shapes
    /// - input: `[batch, seq, d_model]`
    /// - mask_pad: `[batch, seq]`, `true` at padding positions, which no position attends to
    ///   (their own outputs are computed but meaningless)
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        input: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
    ) -> Tensor<B, 3> {
        let [batch, seq, d_model] = input.dims();
        let device = input.device();
        let [q, k, v] = project_heads([&self.query, &self.key, &self.value], input, self.n_heads);
        // One fused operation (burn-fused): under `Autodiff` one graph node, with dropout on
        // the weights drawn from a seed the backward reproduces; FastFlex runs it without the
        // `[batch, heads, seq, seq]` scores in both directions.
        let dropout =
            (B::ad_enabled(&device) && self.dropout.prob > 0.0).then(|| AttentionDropout {
                prob: self.dropout.prob as f32,
                seed: dropout_seed::<B>(&device),
            });
        let mask = mask_pad.map(|pad| pad.reshape([batch, 1, 1, seq]));
        let options = AttentionOptions {
            scale: None,
            causal: self.causal,
            dropout,
        };
        let context = fused_attention(q, k, v, mask, options);
        self.output
            .forward(context.swap_dims(1, 2).reshape([batch, seq, d_model]))
    }
}

/// The query, key and value projections of `input` (`[batch, seq, d_model]`), each split into
/// heads: `[batch, heads, seq, d_model / heads]`.
pub(crate) fn project_heads<B: SketchBackend>(
    [query, key, value]: [&AnyLinear<B>; 3],
    input: Tensor<B, 3>,
    heads: usize,
) -> [Tensor<B, 4>; 3] {
    let project = |layer: &AnyLinear<B>, x| split_heads(layer.forward(x), heads);
    [
        project(query, input.clone()),
        project(key, input.clone()),
        project(value, input),
    ]
}

/// `[batch, seq, d_model]` to `[batch, heads, seq, d_model / heads]`.
fn split_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [batch, seq, d_model] = x.dims();
    x.reshape([batch, seq, heads, d_model / heads])
        .swap_dims(1, 2)
}

/// A seed for one call's attention dropout, drawn from the backend's generator (so that
/// `B::seed` makes training reproducible, as it does for Burn's `Dropout`).
pub(crate) fn dropout_seed<B: Backend>(device: &B::Device) -> u64 {
    // 31 bits each: every backend's integer element (i32 at least) holds them.
    let halves =
        Tensor::<B, 1, Int>::random([2], Distribution::Uniform(0.0, 2_147_483_647.0), device)
            .into_data()
            .convert::<i64>()
            .to_vec::<i64>()
            .expect("two integers");
    ((halves[0] as u64) << 31) ^ halves[1] as u64
}
