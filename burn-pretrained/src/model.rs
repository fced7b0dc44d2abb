//! [`BertEncoder`]: a BERT-family encoder built from burn-compress's [`AnyLinear`] layers, so
//! that a [`Converter`](burn_compress::Converter) can make any of them low-rank, sketched or
//! `int8` after the pretrained weights are loaded.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig};
use burn::tensor::activation::gelu;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use burn_compress::{
    AnyLinear, AnyLinearConfig, AnyMultiHeadAttention, AnyMultiHeadAttentionConfig,
};
use burn_fused::{FusedBackend, fused_layer_norm_module};
use burn_sketch::SketchBackend;

use crate::{BertConfig, PretrainedError};

/// A batch of token sequences, padded on the right to one length.
#[derive(Clone, Debug)]
pub struct EncoderInput<B: Backend> {
    /// Token ids, `[batch, seq]`.
    pub ids: Tensor<B, 2, Int>,
    /// Token type (segment) ids, `[batch, seq]`; `None` is type 0 everywhere.
    pub type_ids: Option<Tensor<B, 2, Int>>,
    /// `true` at padding positions, `[batch, seq]`; `None` is no padding.
    pub mask_pad: Option<Tensor<B, 2, Bool>>,
}

impl<B: Backend> EncoderInput<B> {
    /// The same batch on another backend (the autodiff one of a training, for instance).
    pub fn to_backend<B2: Backend>(&self, device: &B2::Device) -> EncoderInput<B2> {
        let int = |t: &Tensor<B, 2, Int>| Tensor::<B2, 2, Int>::from_data(t.to_data(), device);
        EncoderInput {
            ids: int(&self.ids),
            type_ids: self.type_ids.as_ref().map(int),
            mask_pad: self
                .mask_pad
                .as_ref()
                .map(|m| Tensor::<B2, 2, Bool>::from_data(m.to_data(), device)),
        }
    }
}

/// The embeddings: word + absolute position + token type, then a layer norm and dropout.
#[derive(Module, Debug)]
pub struct BertEmbeddings<B: Backend> {
    /// `[vocab, hidden]`.
    pub word_embeddings: Embedding<B>,
    /// `[max_positions, hidden]`.
    pub position_embeddings: Embedding<B>,
    /// `[type_vocab, hidden]`.
    pub token_type_embeddings: Embedding<B>,
    /// The norm of the sum.
    pub layer_norm: LayerNorm<B>,
    /// Dropout, in training only.
    pub dropout: Dropout,
}

/// A post-norm encoder layer: attention, residual, norm; linear, GELU, linear, residual, norm.
#[derive(Module, Debug)]
pub struct BertLayer<B: Backend> {
    /// Self-attention over [`AnyLinear`] projections.
    pub attention: AnyMultiHeadAttention<B>,
    /// The norm after the attention's residual.
    pub attention_norm: LayerNorm<B>,
    /// `hidden → intermediate`.
    pub intermediate: AnyLinear<B>,
    /// `intermediate → hidden`.
    pub output: AnyLinear<B>,
    /// The norm after the feed-forward residual.
    pub output_norm: LayerNorm<B>,
    /// Dropout on each sub-block's output, in training only.
    pub dropout: Dropout,
}

/// A BERT-family encoder (BERT, MiniLM) as Hugging Face's `BertModel` computes it, without
/// the pooler; [`load_hf`](crate::load_hf) fills it from a checkpoint.
#[derive(Module, Debug)]
pub struct BertEncoder<B: Backend> {
    /// The input embeddings.
    pub embeddings: BertEmbeddings<B>,
    /// The layers, first to last.
    pub layers: Vec<BertLayer<B>>,
}

impl BertConfig {
    /// Builds the encoder with fresh weights (layers of the configured kinds).
    ///
    /// # Panics
    /// On an invalid configuration; [`try_init`](Self::try_init) returns the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> BertEncoder<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise BertEncoder: {err}"))
    }

    /// [`init`](Self::init), or the error naming the bad value.
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<BertEncoder<B>, PretrainedError> {
        self.validate().map_err(|reason| PretrainedError::Config {
            path: "<config>".into(),
            reason,
        })?;
        let (h, f) = (self.hidden_size, self.intermediate_size);
        let norm = || {
            LayerNormConfig::new(h)
                .with_epsilon(self.layer_norm_eps)
                .init(device)
        };
        let dropout = || DropoutConfig::new(self.hidden_dropout_prob).init();
        let embeddings = BertEmbeddings {
            word_embeddings: EmbeddingConfig::new(self.vocab_size, h).init(device),
            position_embeddings: EmbeddingConfig::new(self.max_position_embeddings, h).init(device),
            token_type_embeddings: EmbeddingConfig::new(self.type_vocab_size, h).init(device),
            layer_norm: norm(),
            dropout: dropout(),
        };
        let layers = (0..self.num_hidden_layers)
            .map(|_| {
                Ok(BertLayer {
                    attention: AnyMultiHeadAttentionConfig::new(h, self.num_attention_heads)
                        .with_dropout(self.attention_probs_dropout_prob)
                        .with_projections(self.attention_kind)
                        .try_init(device)?,
                    attention_norm: norm(),
                    intermediate: AnyLinearConfig::new(h, f)
                        .with_kind(self.ffn_kind)
                        .try_init(device)?,
                    output: AnyLinearConfig::new(f, h)
                        .with_kind(self.ffn_kind)
                        .try_init(device)?,
                    output_norm: norm(),
                    dropout: dropout(),
                })
            })
            .collect::<Result<_, PretrainedError>>()?;
        Ok(BertEncoder { embeddings, layers })
    }
}

impl<B: FusedBackend> BertEmbeddings<B> {
    /// `[batch, seq]` ids to `[batch, seq, hidden]`.
    pub fn forward(&self, input: &EncoderInput<B>) -> Tensor<B, 3> {
        let [batch, seq] = input.ids.dims();
        let device = input.ids.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .expand([batch, seq]);
        let types = input
            .type_ids
            .clone()
            .unwrap_or_else(|| Tensor::zeros([batch, seq], &device));
        let x = self.word_embeddings.forward(input.ids.clone())
            + self.position_embeddings.forward(positions)
            + self.token_type_embeddings.forward(types);
        self.dropout
            .forward(fused_layer_norm_module(&self.layer_norm, x))
    }
}

impl<B: SketchBackend> BertLayer<B> {
    /// `[batch, seq, hidden]` to the same shape; padding keys are not attended to.
    pub fn forward(&self, x: Tensor<B, 3>, mask_pad: Option<Tensor<B, 2, Bool>>) -> Tensor<B, 3> {
        self.forward_traced(x, mask_pad).output
    }

    /// [`forward`](Self::forward), keeping the feed-forward layers' inputs: what a conversion
    /// that fits the layers to the inputs they see (activation-aware low rank) needs.
    pub fn forward_traced(
        &self,
        x: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
    ) -> LayerTrace<B> {
        let attended = self.attention.forward(x.clone(), mask_pad);
        let x = fused_layer_norm_module(&self.attention_norm, x + self.dropout.forward(attended));
        let inner = gelu(self.intermediate.forward(x.clone()));
        let out = self.output.forward(inner.clone());
        LayerTrace {
            output: fused_layer_norm_module(
                &self.output_norm,
                x.clone() + self.dropout.forward(out),
            ),
            intermediate_input: x,
            output_input: inner,
        }
    }
}

/// A layer's output and its feed-forward layers' inputs, each `[batch, seq, width]`.
#[derive(Clone, Debug)]
pub struct LayerTrace<B: Backend> {
    /// The layer's output.
    pub output: Tensor<B, 3>,
    /// The input of [`BertLayer::intermediate`] (width `hidden`).
    pub intermediate_input: Tensor<B, 3>,
    /// The input of [`BertLayer::output`] (width `intermediate`, after the GELU).
    pub output_input: Tensor<B, 3>,
}

impl<B: SketchBackend> BertEncoder<B> {
    /// The last layer's hidden states, `[batch, seq, hidden]` (Hugging Face's
    /// `last_hidden_state`). Padding positions' own states are computed but meaningless.
    pub fn forward(&self, input: &EncoderInput<B>) -> Tensor<B, 3> {
        let mut x = self.embeddings.forward(input);
        for layer in &self.layers {
            x = layer.forward(x, input.mask_pad.clone());
        }
        x
    }

    /// The embeddings' output and every layer's, `layers + 1` tensors of
    /// `[batch, seq, hidden]` (Hugging Face's `hidden_states`): what a distillation matches.
    pub fn hidden_states(&self, input: &EncoderInput<B>) -> Vec<Tensor<B, 3>> {
        let mut states = vec![self.embeddings.forward(input)];
        for layer in &self.layers {
            let last = states.last().expect("the embeddings come first").clone();
            states.push(layer.forward(last, input.mask_pad.clone()));
        }
        states
    }

    /// The hidden width.
    pub fn hidden_size(&self) -> usize {
        self.embeddings.word_embeddings.weight.dims()[1]
    }

    /// The longest sequence the encoder takes (its learned positions).
    pub fn max_positions(&self) -> usize {
        self.embeddings.position_embeddings.weight.dims()[0]
    }

    /// The token vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.embeddings.word_embeddings.weight.dims()[0]
    }
}
