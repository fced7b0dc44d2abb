//! Pretrained models in Burn: Hugging Face BERT-family encoders (BERT, MiniLM), loaded from
//! their own files, built from burn-compress's convertible layers so that any of them can be
//! made low-rank, sketched or `int8` afterwards.
//!
//! - [`load_hf`]: a model directory (`config.json`, `model.safetensors`, `tokenizer.json`)
//!   to a [`Pretrained`] encoder and tokenizer, through burn-store's `SafetensorsStore`, its
//!   PyTorch adapter and a key remapping; [`load_weights`] for the checkpoint alone.
//! - [`BertConfig`], [`BertEncoder`]: the model, as Hugging Face's `BertModel` computes it;
//!   [`BertEncoder::hidden_states`] gives every layer's output, for distillation.
//! - [`BertEncoder`] is burn-compress's `Distillable` (its layers' outputs over real tokens),
//!   so that `burn_compress::distil` trains a converted encoder back toward the original;
//!   [`BertEncoder::with_dropout`] turns its dropout off for that.
//! - [`Tokenizer`]: the model's `tokenizer.json` (the `tokenizers` crate), to padded
//!   [`TokenBatch`]es; [`mean_pool`], [`normalize`] and [`SentenceEncoder`]: sentence
//!   embeddings as sentence-transformers computes them.
//! - [`PretrainedError`]: every error, naming the file, key or value at fault.
//!
//! ```
//! use burn::backend::Flex;
//! use burn_pretrained::{BertConfig, EncoderInput};
//! use burn::tensor::{Int, Tensor};
//!
//! let device = Default::default();
//! // A small random encoder; `load_hf` builds the pretrained one from its directory.
//! let config = BertConfig::new()
//!     .with_vocab_size(100)
//!     .with_hidden_size(32)
//!     .with_num_hidden_layers(2)
//!     .with_num_attention_heads(4)
//!     .with_intermediate_size(64);
//! let encoder = config.init::<Flex>(&device);
//! let ids = Tensor::<Flex, 2, Int>::from_ints([[1, 5, 7, 2], [1, 9, 2, 0]], &device);
//! let input = EncoderInput { ids, type_ids: None, mask_pad: None };
//! assert_eq!(encoder.forward(&input).dims(), [2, 4, 32]);
//! assert_eq!(encoder.hidden_states(&input).len(), 3);
//! ```

mod config;
mod distil;
mod embed;
mod error;
mod load;
mod model;
mod pooling;
mod tokenize;

pub use config::BertConfig;
pub use embed::SentenceEncoder;
pub use error::{Misshapen, PretrainedError};
pub use load::{
    HfFiles, ParamDType, Pretrained, load_hf, load_hf_with, load_weights, load_weights_with,
};
pub use model::{BertEmbeddings, BertEncoder, BertLayer, EncoderInput, LayerTrace};
pub use pooling::{Pooling, PoolingMode, mean_pool, normalize};
pub use tokenize::{TokenBatch, Tokenizer};

/// The crate README's example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
