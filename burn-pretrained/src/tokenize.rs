//! [`Tokenizer`]: a model's own `tokenizer.json` (Hugging Face's `tokenizers` crate), encoding
//! texts into the padded batches the encoder takes.

use std::path::Path;

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use tokenizers::{PaddingDirection, PaddingParams, PaddingStrategy, TruncationParams};

use crate::{EncoderInput, PretrainedError};

/// A batch of encoded texts, padded on the right to the longest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBatch {
    /// Texts.
    pub batch: usize,
    /// Tokens per text after padding.
    pub seq: usize,
    /// Token ids, row-major `[batch, seq]`.
    pub ids: Vec<i64>,
    /// Token type ids, `[batch, seq]`.
    pub type_ids: Vec<i64>,
    /// Real tokens per text (special tokens included): the rest is padding.
    pub lengths: Vec<usize>,
}

impl TokenBatch {
    /// The batch as the encoder's input on `device`.
    pub fn to_input<B: Backend>(&self, device: &B::Device) -> EncoderInput<B> {
        let shape = [self.batch, self.seq];
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(self.ids.clone(), shape), device);
        let type_ids =
            Tensor::<B, 2, Int>::from_data(TensorData::new(self.type_ids.clone(), shape), device);
        let padded = self.lengths.iter().any(|&len| len < self.seq);
        let mask_pad = padded.then(|| {
            let pad: Vec<bool> = self
                .lengths
                .iter()
                .flat_map(|&len| (0..self.seq).map(move |pos| pos >= len))
                .collect();
            Tensor::<B, 2, Bool>::from_data(TensorData::new(pad, shape), device)
        });
        EncoderInput {
            ids,
            type_ids: Some(type_ids),
            mask_pad,
        }
    }
}

/// A Hugging Face tokenizer that truncates to `max_length` tokens and pads a batch to its
/// longest text.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    max_length: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.inner.get_vocab_size(true))
            .field("max_length", &self.max_length)
            .finish()
    }
}

impl Tokenizer {
    /// Reads `tokenizer.json`. Texts are cut to `max_length` tokens (special tokens included).
    pub fn from_file(path: impl AsRef<Path>, max_length: usize) -> Result<Self, PretrainedError> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|err| PretrainedError::Tokenizer(format!("{}: {err}", path.display())))?;
        Self::new(inner, max_length)
    }

    /// [`from_file`](Self::from_file) on the file's text.
    pub fn from_json(json: &str, max_length: usize) -> Result<Self, PretrainedError> {
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|err| PretrainedError::Tokenizer(format!("{err}")))?;
        Self::new(inner, max_length)
    }

    fn new(mut inner: tokenizers::Tokenizer, max_length: usize) -> Result<Self, PretrainedError> {
        if max_length < 2 {
            return Err(PretrainedError::Input(format!(
                "max_length {max_length}: at least 2 (the special tokens)"
            )));
        }
        let (pad_id, pad_token, pad_type_id) = match inner.get_padding() {
            Some(p) => (p.pad_id, p.pad_token.clone(), p.pad_type_id),
            None => (0, "[PAD]".to_string(), 0),
        };
        inner
            .with_truncation(Some(TruncationParams {
                max_length,
                ..Default::default()
            }))
            .map_err(|err| PretrainedError::Tokenizer(err.to_string()))?;
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            direction: PaddingDirection::Right,
            pad_id,
            pad_type_id,
            pad_token,
            pad_to_multiple_of: None,
        }));
        Ok(Self { inner, max_length })
    }

    /// The most tokens a text keeps.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// `tokenizers`' own tokenizer, for what this wrapper does not expose.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Encodes `texts` with the model's special tokens (`[CLS] … [SEP]`), cut to
    /// [`max_length`](Self::max_length) and padded to the longest. An empty text is its
    /// special tokens alone; an empty batch is an error.
    pub fn encode<S: AsRef<str>>(&self, texts: &[S]) -> Result<TokenBatch, PretrainedError> {
        if texts.is_empty() {
            return Err(PretrainedError::Input("no text to encode".into()));
        }
        let texts: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        let encodings = self
            .inner
            .encode_batch(texts, true)
            .map_err(|err| PretrainedError::Tokenizer(err.to_string()))?;
        let seq = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut batch = TokenBatch {
            batch: encodings.len(),
            seq,
            ids: Vec::with_capacity(encodings.len() * seq),
            type_ids: Vec::with_capacity(encodings.len() * seq),
            lengths: Vec::with_capacity(encodings.len()),
        };
        for encoding in &encodings {
            batch
                .ids
                .extend(encoding.get_ids().iter().map(|&id| id as i64));
            batch
                .type_ids
                .extend(encoding.get_type_ids().iter().map(|&id| id as i64));
            batch.lengths.push(
                encoding
                    .get_attention_mask()
                    .iter()
                    .filter(|&&m| m == 1)
                    .count(),
            );
        }
        Ok(batch)
    }
}
