//! A pre-norm transformer block (attention and MLP, each behind a layer norm and a residual
//! connection) whose linear layers are [`AnyLinear`]s.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Gelu, LayerNorm, LayerNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};
use burn_fused::fused_layer_norm_module;

use serde::{Deserialize, Serialize};

use super::{
    AnyLinear, AnyLinearConfig, AnyMultiHeadAttention, AnyMultiHeadAttentionConfig, FeatureMap,
    LinearKind, PerformerAttention, PerformerAttentionConfig,
};
use burn_sketch::{Activation, SketchBackend};

use crate::CompressError;

/// Configuration of an [`Mlp`].
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Input and output width.
    pub d_model: usize,
    /// Hidden width.
    pub d_ff: usize,
    /// Dropout after the activation, in training only.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// The kind of both linear layers.
    #[config(default = "LinearKind::Dense")]
    pub kind: LinearKind,
}

impl MlpConfig {
    /// Initializes the MLP, or returns the error naming a bad size.
    pub fn try_init<B: Backend>(&self, device: &B::Device) -> Result<Mlp<B>, CompressError> {
        let layer = |d_in, d_out| {
            AnyLinearConfig::new(d_in, d_out)
                .with_kind(self.kind)
                .try_init(device)
        };
        Ok(Mlp {
            fc1: layer(self.d_model, self.d_ff)?,
            fc2: layer(self.d_ff, self.d_model)?,
            activation: Gelu::new(),
            dropout: DropoutConfig::new(self.dropout).init(),
        })
    }

    /// [`try_init`](Self::try_init), panicking with the error's message.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Mlp<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise Mlp: {err}"))
    }
}

/// The transformer's position-wise MLP: `fc2(dropout(gelu(fc1(x))))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `d_model → d_ff`.
    pub fc1: AnyLinear<B>,
    /// `d_ff → d_model`.
    pub fc2: AnyLinear<B>,
    /// The activation. `forward` applies it inside `fc1`'s product
    /// ([`AnyLinear::forward_activated`]); the module stays a field so that records keep
    /// their shape.
    pub activation: Gelu,
    /// Dropout after the activation.
    pub dropout: Dropout,
}

impl<B: SketchBackend> Mlp<B> {
    /// # Shapes
    /// - input: `[..., d_model]`
    /// - output: `[..., d_model]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        let hidden = self.fc1.forward_activated(input, Activation::Gelu);
        self.fc2.forward(self.dropout.forward(hidden))
    }
}

/// Which attention a [`TransformerBlock`] computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttentionKind {
    /// Exact softmax attention ([`AnyMultiHeadAttention`]): `O(seq²)` time and memory.
    #[default]
    Softmax,
    /// Performer attention ([`PerformerAttention`]) with `num_features` random features:
    /// `O(seq · num_features)`.
    Performer {
        /// Random features `m`.
        num_features: usize,
        /// The feature map.
        feature_map: FeatureMap,
    },
}

/// The attention module of a [`TransformerBlock`].
#[derive(Module, Debug)]
pub enum BlockAttention<B: Backend> {
    /// Softmax attention.
    Softmax(AnyMultiHeadAttention<B>),
    /// Performer attention.
    Performer(PerformerAttention<B>),
}

impl<B: SketchBackend> BlockAttention<B> {
    /// # Shapes
    /// - input: `[batch, seq, d_model]`
    /// - mask_pad: `[batch, seq]`, `true` at padding positions
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        input: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
    ) -> Tensor<B, 3> {
        match self {
            Self::Softmax(attention) => attention.forward(input, mask_pad),
            Self::Performer(attention) => attention.forward(input, mask_pad),
        }
    }
}

/// Configuration of a [`TransformerBlock`].
#[derive(Config, Debug)]
pub struct TransformerBlockConfig {
    /// The model width.
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub n_heads: usize,
    /// The MLP's hidden width.
    pub d_ff: usize,
    /// Dropout on the attention weights, after the MLP's activation and on each residual
    /// branch, in training only.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// If the attention is causal (a language model's).
    #[config(default = true)]
    pub causal: bool,
    /// Softmax attention or its Performer approximation.
    #[config(default = "AttentionKind::Softmax")]
    pub attention: AttentionKind,
    /// The kind of the attention's four projections.
    #[config(default = "LinearKind::Dense")]
    pub projections: LinearKind,
    /// The kind of the MLP's two layers.
    #[config(default = "LinearKind::Dense")]
    pub mlp: LinearKind,
}

impl TransformerBlockConfig {
    /// Initializes the block, or returns the error naming a bad size.
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<TransformerBlock<B>, CompressError> {
        Ok(TransformerBlock {
            norm_attention: LayerNormConfig::new(self.d_model).init(device),
            attention: match self.attention {
                AttentionKind::Softmax => BlockAttention::Softmax(
                    AnyMultiHeadAttentionConfig::new(self.d_model, self.n_heads)
                        .with_dropout(self.dropout)
                        .with_causal(self.causal)
                        .with_projections(self.projections)
                        .try_init(device)?,
                ),
                AttentionKind::Performer {
                    num_features,
                    feature_map,
                } => BlockAttention::Performer(
                    PerformerAttentionConfig::new(self.d_model, self.n_heads)
                        .with_num_features(num_features)
                        .with_feature_map(feature_map)
                        .with_causal(self.causal)
                        .with_projections(self.projections)
                        .try_init(device)?,
                ),
            },
            norm_mlp: LayerNormConfig::new(self.d_model).init(device),
            mlp: MlpConfig::new(self.d_model, self.d_ff)
                .with_dropout(self.dropout)
                .with_kind(self.mlp)
                .try_init(device)?,
            dropout: DropoutConfig::new(self.dropout).init(),
        })
    }

    /// [`try_init`](Self::try_init), panicking with the error's message.
    pub fn init<B: Backend>(&self, device: &B::Device) -> TransformerBlock<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise TransformerBlock: {err}"))
    }
}

/// A pre-norm transformer block (as in GPT-2):
///
/// ```text
/// x = x + dropout(attention(norm_attention(x)))
/// x = x + dropout(mlp(norm_mlp(x)))
/// ```
///
/// Pre-norm keeps the residual stream un-normalised, which trains stably without warm-up at
/// the small sizes this crate's study uses.
#[derive(Module, Debug)]
pub struct TransformerBlock<B: Backend> {
    /// Layer norm before the attention.
    pub norm_attention: LayerNorm<B>,
    /// Self-attention.
    pub attention: BlockAttention<B>,
    /// Layer norm before the MLP.
    pub norm_mlp: LayerNorm<B>,
    /// The MLP.
    pub mlp: Mlp<B>,
    /// Dropout on each residual branch.
    pub dropout: Dropout,
}

impl<B: SketchBackend> TransformerBlock<B> {
    /// # Shapes
    /// - input: `[batch, seq, d_model]`
    /// - mask_pad: `[batch, seq]`, `true` at padding positions
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        input: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
    ) -> Tensor<B, 3> {
        // The norms as one fused operation each (burn-fused): under `Autodiff` one node,
        // not Burn's decomposition into a dozen.
        let attended = self.attention.forward(
            fused_layer_norm_module(&self.norm_attention, input.clone()),
            mask_pad,
        );
        let x = input + self.dropout.forward(attended);
        let transformed = self
            .mlp
            .forward(fused_layer_norm_module(&self.norm_mlp, x.clone()));
        x + self.dropout.forward(transformed)
    }
}
