//! [`BertConfig`]: a BERT-family encoder's shapes, read from a Hugging Face `config.json`.

use std::path::Path;

use burn::config::Config;
use burn_compress::LinearKind;

use crate::PretrainedError;

/// The shapes of a BERT-family encoder (BERT, MiniLM): post-norm layers, exact GELU, learned
/// absolute positions and token types. [`from_hf_json`](Self::from_hf_json) reads them from a
/// Hugging Face `config.json`; the defaults are all-MiniLM-L6-v2's.
#[derive(Config, Debug, PartialEq)]
pub struct BertConfig {
    /// Token vocabulary.
    #[config(default = 30522)]
    pub vocab_size: usize,
    /// Hidden width.
    #[config(default = 384)]
    pub hidden_size: usize,
    /// Encoder layers.
    #[config(default = 6)]
    pub num_hidden_layers: usize,
    /// Attention heads per layer; divides `hidden_size`.
    #[config(default = 12)]
    pub num_attention_heads: usize,
    /// The feed-forward block's inner width.
    #[config(default = 1536)]
    pub intermediate_size: usize,
    /// Learned positions: the longest sequence the encoder takes.
    #[config(default = 512)]
    pub max_position_embeddings: usize,
    /// Token types (segments).
    #[config(default = 2)]
    pub type_vocab_size: usize,
    /// Layer norms' epsilon.
    #[config(default = 1e-12)]
    pub layer_norm_eps: f64,
    /// Dropout after the embeddings and each sub-block, in training only.
    #[config(default = 0.1)]
    pub hidden_dropout_prob: f64,
    /// Dropout on the attention weights, in training only.
    #[config(default = 0.1)]
    pub attention_probs_dropout_prob: f64,
    /// The kind of the attention projections (query, key, value, output).
    #[config(default = "LinearKind::Dense")]
    pub attention_kind: LinearKind,
    /// The kind of the two feed-forward layers.
    #[config(default = "LinearKind::Dense")]
    pub ffn_kind: LinearKind,
}

/// The fields of a Hugging Face `config.json` this crate reads or checks.
#[derive(serde::Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    type_vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_positions")]
    position_embedding_type: String,
    #[serde(default = "default_dropout")]
    hidden_dropout_prob: f64,
    #[serde(default = "default_dropout")]
    attention_probs_dropout_prob: f64,
    #[serde(default)]
    is_decoder: bool,
}

fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_positions() -> String {
    "absolute".into()
}
fn default_dropout() -> f64 {
    0.1
}

/// `model_type`s whose checkpoints have BERT's layout and forward.
const BERT_FAMILY: [&str; 1] = ["bert"];

impl BertConfig {
    /// Reads a Hugging Face `config.json`.
    ///
    /// Errors ([`PretrainedError::Config`]): a model type outside the BERT family, an
    /// activation other than the exact GELU, relative positions, a decoder, zero sizes or heads
    /// that do not divide the width, each named.
    pub fn from_hf_file(path: impl AsRef<Path>) -> Result<Self, PretrainedError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| PretrainedError::Io {
            path: path.into(),
            source,
        })?;
        Self::from_hf_json(&text).map_err(|err| match err {
            PretrainedError::Config { reason, .. } => PretrainedError::Config {
                path: path.into(),
                reason,
            },
            other => other,
        })
    }

    /// [`from_hf_file`](Self::from_hf_file) on the file's text.
    pub fn from_hf_json(json: &str) -> Result<Self, PretrainedError> {
        let bad = |reason: String| PretrainedError::Config {
            path: "<memory>".into(),
            reason,
        };
        let hf: HfConfig = serde_json::from_str(json).map_err(|err| bad(err.to_string()))?;
        if let Some(kind) = &hf.model_type
            && !BERT_FAMILY.contains(&kind.as_str())
        {
            return Err(bad(format!(
                "model_type \"{kind}\" is not supported (BERT-family encoders: {BERT_FAMILY:?})"
            )));
        }
        if hf.hidden_act != "gelu" {
            return Err(bad(format!(
                "hidden_act \"{}\" is not supported (the exact GELU, \"gelu\", only)",
                hf.hidden_act
            )));
        }
        if hf.position_embedding_type != "absolute" {
            return Err(bad(format!(
                "position_embedding_type \"{}\" is not supported (\"absolute\" only)",
                hf.position_embedding_type
            )));
        }
        if hf.is_decoder {
            return Err(bad("is_decoder is true: an encoder is expected".into()));
        }
        let config = Self::new()
            .with_vocab_size(hf.vocab_size)
            .with_hidden_size(hf.hidden_size)
            .with_num_hidden_layers(hf.num_hidden_layers)
            .with_num_attention_heads(hf.num_attention_heads)
            .with_intermediate_size(hf.intermediate_size)
            .with_max_position_embeddings(hf.max_position_embeddings)
            .with_type_vocab_size(hf.type_vocab_size)
            .with_layer_norm_eps(hf.layer_norm_eps)
            .with_hidden_dropout_prob(hf.hidden_dropout_prob)
            .with_attention_probs_dropout_prob(hf.attention_probs_dropout_prob);
        config.validate().map_err(bad)?;
        Ok(config)
    }

    /// Checks the sizes: none zero, heads dividing the width. The message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} is 0"));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "num_attention_heads {} does not divide hidden_size {}",
                self.num_attention_heads, self.hidden_size
            ));
        }
        Ok(())
    }

    /// The checkpoint tensors the configuration implies, in Hugging Face's names and
    /// PyTorch's layout (a linear weight is `[out, in]`), without the unused pooler.
    pub fn hf_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, f) = (self.hidden_size, self.intermediate_size);
        let mut tensors = vec![
            (
                "embeddings.word_embeddings.weight".to_string(),
                vec![self.vocab_size, h],
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![self.max_position_embeddings, h],
            ),
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![self.type_vocab_size, h],
            ),
            ("embeddings.LayerNorm.weight".into(), vec![h]),
            ("embeddings.LayerNorm.bias".into(), vec![h]),
        ];
        for layer in 0..self.num_hidden_layers {
            let p = format!("encoder.layer.{layer}");
            let linear = |name: &str, d_out: usize, d_in: usize| {
                [
                    (format!("{p}.{name}.weight"), vec![d_out, d_in]),
                    (format!("{p}.{name}.bias"), vec![d_out]),
                ]
            };
            for name in [
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
            ] {
                tensors.extend(linear(name, h, h));
            }
            tensors.extend(linear("attention.output.dense", h, h));
            tensors.extend(linear("attention.output.LayerNorm", h, 0).map(|(k, _)| (k, vec![h])));
            tensors.extend(linear("intermediate.dense", f, h));
            tensors.extend(linear("output.dense", h, f));
            tensors.extend(linear("output.LayerNorm", h, 0).map(|(k, _)| (k, vec![h])));
        }
        tensors
    }
}
