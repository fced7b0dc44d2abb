//! A BERT-class text encoder written the way a Burn user would write it: only `burn::nn`'s
//! modules (three `Embedding`s, `LayerNorm`, `Linear`, `MultiHeadAttention` with a padding
//! mask, `Dropout`) and `burn::tensor::activation::gelu`, generic over the backend. Nothing of
//! this project's crates is used, so that `encoder_bench` times Burn as a user gets it.
//!
//! The defaults are all-MiniLM-L6-v2's shapes (vocabulary 30,522, width 384, 6 layers of 12
//! heads, feed-forward 1,536, 512 positions, 2 token types), laid out as Hugging Face's
//! `BertModel`: post-norm layers, exact (erf) GELU, layer-norm epsilon 10⁻¹².

use burn::config::Config;
use burn::module::Module;
use burn::nn::attention::{MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear,
    LinearConfig,
};
use burn::tensor::activation::gelu;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};

/// The encoder's shapes; [`EncoderConfig::new`] gives all-MiniLM-L6-v2's.
#[derive(Config, Debug)]
pub struct EncoderConfig {
    /// Token vocabulary.
    #[config(default = 30522)]
    pub vocab: usize,
    /// Hidden width (`d_model`).
    #[config(default = 384)]
    pub hidden: usize,
    /// Encoder layers.
    #[config(default = 6)]
    pub layers: usize,
    /// Attention heads per layer (`hidden / heads` per head).
    #[config(default = 12)]
    pub heads: usize,
    /// The feed-forward block's inner width.
    #[config(default = 1536)]
    pub ffn: usize,
    /// Learned positions: the longest sequence the encoder takes.
    #[config(default = 512)]
    pub max_positions: usize,
    /// Token types (segment embeddings); the forward uses type 0 throughout.
    #[config(default = 2)]
    pub type_vocab: usize,
    /// Dropout after the embeddings, on the attention weights and after each sub-block (only
    /// active under an autodiff backend).
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Layer norms' epsilon (BERT's 10⁻¹²).
    #[config(default = 1e-12)]
    pub layer_norm_eps: f64,
    /// With a rank `r`, each feed-forward projection is two `Linear`s through `r` values (a
    /// low-rank model, as a compressed one is): `hidden → r → ffn` and `ffn → r → hidden`.
    #[config(default = "None")]
    pub ffn_rank: Option<usize>,
}

/// A post-norm transformer encoder layer, as BERT's: attention, residual, norm; then
/// linear, GELU, linear, residual, norm.
#[derive(Module, Debug)]
pub struct EncoderLayer<B: Backend> {
    /// Self-attention (query, key, value and output projections).
    pub attention: MultiHeadAttention<B>,
    /// The norm after the attention's residual.
    pub attention_norm: LayerNorm<B>,
    /// `hidden → ffn` (`r → ffn` with a rank).
    pub intermediate: Linear<B>,
    /// With a rank `r`: `hidden → r`, before [`intermediate`](Self::intermediate).
    pub intermediate_factor: Option<Linear<B>>,
    /// `ffn → hidden` (`r → hidden` with a rank).
    pub output: Linear<B>,
    /// With a rank `r`: `ffn → r`, before [`output`](Self::output).
    pub output_factor: Option<Linear<B>>,
    /// The norm after the feed-forward block's residual.
    pub output_norm: LayerNorm<B>,
    /// Dropout on each sub-block's output.
    pub dropout: Dropout,
}

impl<B: Backend> EncoderLayer<B> {
    /// `x`: `[batch, seq, hidden]`; `mask_pad`: `[batch, seq]`, `true` at padding.
    pub fn forward(&self, x: Tensor<B, 3>, mask_pad: Tensor<B, 2, Bool>) -> Tensor<B, 3> {
        let attended = self
            .attention
            .forward(MhaInput::self_attn(x.clone()).mask_pad(mask_pad))
            .context;
        let x = self
            .attention_norm
            .forward(x + self.dropout.forward(attended));
        let through = |factor: &Option<Linear<B>>, layer: &Linear<B>, x: Tensor<B, 3>| match factor
        {
            Some(factor) => layer.forward(factor.forward(x)),
            None => layer.forward(x),
        };
        let inner = gelu(through(
            &self.intermediate_factor,
            &self.intermediate,
            x.clone(),
        ));
        let h = through(&self.output_factor, &self.output, inner);
        self.output_norm.forward(x + self.dropout.forward(h))
    }
}

/// The encoder: token, position and token-type embeddings summed and normalised, then
/// [`EncoderConfig::layers`] [`EncoderLayer`]s. No pooler: the output is the last hidden state.
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    /// `[vocab, hidden]`.
    pub tokens: Embedding<B>,
    /// `[max_positions, hidden]`.
    pub positions: Embedding<B>,
    /// `[type_vocab, hidden]`.
    pub token_types: Embedding<B>,
    /// The embeddings' norm.
    pub embedding_norm: LayerNorm<B>,
    /// Dropout after the embeddings.
    pub dropout: Dropout,
    /// The layers.
    pub layers: Vec<EncoderLayer<B>>,
}

impl EncoderConfig {
    /// The encoder, its parameters drawn by Burn's default initialisers (seed the backend
    /// first for the same weights every run).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Encoder<B> {
        let norm = || {
            LayerNormConfig::new(self.hidden)
                .with_epsilon(self.layer_norm_eps)
                .init(device)
        };
        let layers = (0..self.layers)
            .map(|_| EncoderLayer {
                attention: MultiHeadAttentionConfig::new(self.hidden, self.heads)
                    .with_dropout(self.dropout)
                    .init(device),
                attention_norm: norm(),
                intermediate: LinearConfig::new(self.ffn_rank.unwrap_or(self.hidden), self.ffn)
                    .init(device),
                intermediate_factor: self.ffn_rank.map(|r| {
                    LinearConfig::new(self.hidden, r)
                        .with_bias(false)
                        .init(device)
                }),
                output: LinearConfig::new(self.ffn_rank.unwrap_or(self.ffn), self.hidden)
                    .init(device),
                output_factor: self
                    .ffn_rank
                    .map(|r| LinearConfig::new(self.ffn, r).with_bias(false).init(device)),
                output_norm: norm(),
                dropout: DropoutConfig::new(self.dropout).init(),
            })
            .collect();
        Encoder {
            tokens: EmbeddingConfig::new(self.vocab, self.hidden).init(device),
            positions: EmbeddingConfig::new(self.max_positions, self.hidden).init(device),
            token_types: EmbeddingConfig::new(self.type_vocab, self.hidden).init(device),
            embedding_norm: norm(),
            dropout: DropoutConfig::new(self.dropout).init(),
            layers,
        }
    }
}

impl<B: Backend> Encoder<B> {
    /// `token_ids`: `[batch, seq]` (`seq ≤ max_positions`); `mask_pad`: `[batch, seq]`, `true`
    /// where a position is padding (no position attends to it). Returns the last hidden
    /// state, `[batch, seq, hidden]`, in the parameters' float type; the rows at padded
    /// positions are computed but meaningless.
    pub fn forward(
        &self,
        token_ids: Tensor<B, 2, Int>,
        mask_pad: Tensor<B, 2, Bool>,
    ) -> Tensor<B, 3> {
        let [batch, seq] = token_ids.dims();
        let device = token_ids.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let types = Tensor::<B, 2, Int>::zeros([batch, seq], &device);
        let x = self.tokens.forward(token_ids)
            + self.positions.forward(positions)
            + self.token_types.forward(types);
        let x = self.dropout.forward(self.embedding_norm.forward(x));
        self.layers
            .iter()
            .fold(x, |x, layer| layer.forward(x, mask_pad.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, TensorData};

    type B = Flex;

    fn small() -> EncoderConfig {
        EncoderConfig::new()
            .with_vocab(100)
            .with_hidden(32)
            .with_layers(2)
            .with_heads(4)
            .with_ffn(64)
            .with_max_positions(16)
    }

    #[test]
    fn a_sentence_alone_equals_the_same_sentence_padded_in_a_batch() {
        let device = Default::default();
        B::seed(&device, 7);
        let encoder = small().init::<B>(&device);
        let (seq, short) = (10, 6);
        // Row 0: a full sentence; row 1: `short` tokens then padding of other token ids.
        let ids = Tensor::<B, 2, Int>::random([2, seq], Distribution::Uniform(0.0, 100.0), &device);
        let mask = Tensor::<B, 2, Bool>::from_data(
            TensorData::new(
                (0..2 * seq)
                    .map(|i| i >= seq && i % seq >= short)
                    .collect::<Vec<_>>(),
                [2, seq],
            ),
            &device,
        );
        let batched = encoder.forward(ids.clone(), mask);
        assert_eq!(batched.dims(), [2, seq, 32]);

        let alone_ids = ids.clone().slice([1..2, 0..short]);
        let alone = encoder.forward(
            alone_ids,
            Tensor::<B, 2, Bool>::from_data(
                TensorData::new(vec![false; short], [1, short]),
                &device,
            ),
        );
        let padded = batched.clone().slice([1..2, 0..short]);
        let gap: f32 = (alone.clone() - padded).abs().max().into_scalar();
        assert!(gap < 1e-4, "padded and alone differ by {gap}");

        // Without the mask, the padding changes the sentence's states.
        let unmasked = encoder.forward(
            ids,
            Tensor::<B, 2, Bool>::from_data(
                TensorData::new(vec![false; 2 * seq], [2, seq]),
                &device,
            ),
        );
        let leak: f32 = (alone - unmasked.slice([1..2, 0..short]))
            .abs()
            .max()
            .into_scalar();
        assert!(leak > 1e-3, "the padding should matter without the mask");
        // The full row is finite everywhere.
        let finite: f32 = batched.abs().max().into_scalar();
        assert!(finite.is_finite());
    }

    #[test]
    fn a_low_rank_encoder_has_fewer_parameters_and_the_same_output_shape() {
        let device = Default::default();
        let dense = small().init::<B>(&device);
        let low = small().with_ffn_rank(Some(8)).init::<B>(&device);
        let per_layer = |l: &EncoderLayer<B>| {
            l.intermediate.num_params()
                + l.output.num_params()
                + l.intermediate_factor.as_ref().map_or(0, |f| f.num_params())
                + l.output_factor.as_ref().map_or(0, |f| f.num_params())
        };
        // 32 → 64 → 32 dense: 2·32·64 weights and 64 + 32 biases; through rank 8: 8·(32 + 64)
        // twice, and the same biases.
        assert_eq!(per_layer(&dense.layers[0]), 2 * 32 * 64 + 64 + 32);
        assert_eq!(per_layer(&low.layers[0]), 2 * 8 * (32 + 64) + 64 + 32);
        let ids = Tensor::<B, 2, Int>::zeros([2, 5], &device);
        let mask =
            Tensor::<B, 2, Bool>::from_data(TensorData::new(vec![false; 10], [2, 5]), &device);
        assert_eq!(low.forward(ids, mask).dims(), [2, 5, 32]);
    }
}
