//! Text in: a model's tokenizer runs on the server, so that clients send texts, not token ids.
//!
//! A [`TextModel`] pairs a served model whose input is `INT64 [-1, width]` token ids (padded
//! at the end) with its [`Tokenize`]r. A request's texts are tokenized off the HTTP threads
//! (a blocking pool, at most `tokenization_workers` requests at once), checked against the
//! input length (cut or refused, by the request's choice), padded into id rows and cut into
//! parts that each fit one batch by rows and by tokens; the parts join the model's one
//! batcher, so text and id requests batch together.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::{Batcher, HostData, HostTensor, ServeError, Ticket};

/// A model's tokenizer, as the server runs it: the ids of one text, and its tokens for
/// `/tokenize`. Implement it over the model's own tokenizer (burn-pretrained's, Hugging Face
/// `tokenizers`').
pub trait Tokenize: Send + Sync + 'static {
    /// `text`'s ids, the model's special tokens included, cut to
    /// [`max_length`](Self::max_length) tokens the way the model was trained to cut (BERT
    /// keeps its final `[SEP]`); [`Encoded::truncated`] says whether anything was cut.
    fn encode(&self, text: &str) -> Result<Encoded, ServeError>;

    /// `text`'s tokens, with or without the special ones, uncut: what `/tokenize` answers.
    fn tokens(&self, text: &str, add_special_tokens: bool) -> Result<Vec<Token>, ServeError>;

    /// The most tokens a text keeps, special tokens included.
    fn max_length(&self) -> usize;
}

/// One text's token ids ([`Tokenize::encode`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// The ids, special tokens included, at most `max_length`.
    pub ids: Vec<i64>,
    /// Whether the text had more tokens than `max_length` (then `ids` is the cut form).
    pub truncated: bool,
}

/// One token of a text, as `/tokenize` answers (TEI's shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// Its id.
    pub id: i64,
    /// Its text in the vocabulary.
    pub text: String,
    /// Whether the tokenizer added it (`[CLS]`, `[SEP]`).
    pub special: bool,
    /// The byte where it starts in the text (`None` for a special token).
    pub start: Option<usize>,
    /// The byte after it ends.
    pub stop: Option<usize>,
}

/// A served model that takes text: its tokenizer and what the embedding endpoints report and
/// allow ([`crate::Server::add_text_model`]).
#[derive(Clone)]
pub struct TextModel {
    /// The tokenizer.
    pub tokenizer: Arc<dyn Tokenize>,
    /// The model's identity for `/info` and OpenAI's `model` (a hub id or a directory).
    pub model_id: String,
    /// How its weights are stored, for `/info` (`float32`, `bfloat16`, `int8`).
    pub dtype: String,
    /// How it pools token states into an embedding, for `/info` (`mean`, `cls`).
    pub pooling: String,
    /// Whether the model's output rows are unit-length already (a sentence-transformers
    /// pipeline ending in `Normalize`): then `normalize: false` cannot undo it.
    pub normalized: bool,
    /// The id rows are padded with.
    pub pad_id: i64,
    /// Whether a text over the input length is cut when the request does not say
    /// (TEI's `--auto-truncate`); else such a request is refused with 413.
    pub truncate: bool,
    /// The most texts one request may hold (a longer list is refused with 413).
    pub max_client_batch_size: usize,
    /// Requests tokenized at once, each on a thread of the blocking pool.
    pub tokenization_workers: usize,
    /// The name of the Open Inference Protocol's `BYTES` input that takes texts.
    pub text_input: String,
}

impl std::fmt::Debug for TextModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextModel")
            .field("model_id", &self.model_id)
            .field("max_length", &self.tokenizer.max_length())
            .field("pooling", &self.pooling)
            .field("truncate", &self.truncate)
            .finish_non_exhaustive()
    }
}

impl TextModel {
    /// A text model of `tokenizer`: `float32`, mean pooling, not normalized, padded with 0,
    /// no truncation unless asked, at most 1024 texts per request, two tokenizing requests at
    /// once, texts in the `text` input.
    pub fn new(tokenizer: Arc<dyn Tokenize>, model_id: impl Into<String>) -> Self {
        Self {
            tokenizer,
            model_id: model_id.into(),
            dtype: "float32".into(),
            pooling: "mean".into(),
            normalized: false,
            pad_id: 0,
            truncate: false,
            max_client_batch_size: 1024,
            tokenization_workers: 2,
            text_input: "text".into(),
        }
    }
}

/// A text model as the server holds it: the settings, the row width and the tokenizing
/// permits.
pub(crate) struct TextFront {
    pub(crate) model: TextModel,
    width: usize,
    permits: Arc<Semaphore>,
}

/// What a request asks to embed: texts, or token ids already (OpenAI's `input` may be either).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Inputs {
    Texts(Vec<Vec<u8>>),
    Ids(Vec<Vec<i64>>),
}

/// A request's embeddings and the tokens they took.
pub(crate) struct Embedded {
    pub(crate) rows: Vec<Vec<f32>>,
    pub(crate) tokens: usize,
}

impl TextFront {
    pub(crate) fn new(model: TextModel, width: usize) -> Result<Self, ServeError> {
        let max = model.tokenizer.max_length();
        if max == 0 || max > width {
            return Err(ServeError::invalid(
                "text model",
                format!("the tokenizer keeps {max} tokens; the model's rows hold {width}"),
            ));
        }
        if model.max_client_batch_size == 0 || model.tokenization_workers == 0 {
            return Err(ServeError::invalid(
                "text model",
                "max_client_batch_size and tokenization_workers must be at least 1",
            ));
        }
        let permits = Arc::new(Semaphore::new(model.tokenization_workers));
        Ok(Self {
            model,
            width,
            permits,
        })
    }

    /// The most tokens a text keeps.
    pub(crate) fn max_length(&self) -> usize {
        self.model.tokenizer.max_length()
    }

    /// Each input's ids: texts tokenized on the blocking pool (cut when `truncate`, else
    /// refused past the input length), ids checked for length.
    pub(crate) async fn ids(
        &self,
        inputs: Inputs,
        truncate: Option<bool>,
    ) -> Result<Vec<Vec<i64>>, ServeError> {
        let count = match &inputs {
            Inputs::Texts(texts) => texts.len(),
            Inputs::Ids(ids) => ids.len(),
        };
        if count == 0 {
            return Err(ServeError::bad("no input to embed: the list is empty"));
        }
        if count > self.model.max_client_batch_size {
            return Err(ServeError::TooLarge {
                rows: count,
                max: self.model.max_client_batch_size,
            });
        }
        let max = self.max_length();
        let truncate = truncate.unwrap_or(self.model.truncate);
        match inputs {
            Inputs::Ids(ids) => {
                if let Some(index) = ids.iter().position(|row| row.len() > max) {
                    return Err(ServeError::InputTooLong { index, max });
                }
                if let Some(index) = ids.iter().position(Vec::is_empty) {
                    return Err(ServeError::bad(format!("input {index} holds no token id")));
                }
                Ok(ids)
            }
            Inputs::Texts(texts) => {
                let _permit = self
                    .permits
                    .acquire()
                    .await
                    .map_err(|_| ServeError::ShuttingDown)?;
                let tokenizer = Arc::clone(&self.model.tokenizer);
                tokio::task::spawn_blocking(move || {
                    texts
                        .iter()
                        .enumerate()
                        .map(|(index, bytes)| {
                            let text = std::str::from_utf8(bytes).map_err(|error| {
                                ServeError::bad(format!("input {index} is not UTF-8: {error}"))
                            })?;
                            let encoded = tokenizer.encode(text)?;
                            if encoded.truncated && !truncate {
                                return Err(ServeError::InputTooLong { index, max });
                            }
                            Ok(encoded.ids)
                        })
                        .collect()
                })
                .await
                .map_err(|error| ServeError::Model(format!("the tokenizer panicked: {error}")))?
            }
        }
    }

    /// `ids` as rows of the model's width, padded, in parts that each fit one batch of
    /// `batcher` by rows and by tokens, each submitted: the tickets in order.
    pub(crate) fn submit(
        &self,
        batcher: &Batcher,
        ids: &[Vec<i64>],
        deadline: Option<Instant>,
    ) -> Result<Vec<Ticket>, ServeError> {
        let config = batcher.config();
        let rows: Vec<HostTensor> = ids.iter().map(|ids| self.row(ids)).collect();
        let mut tickets = Vec::new();
        let mut part: Vec<HostTensor> = Vec::new();
        let mut part_tokens = 0;
        for row in rows {
            let tokens = batcher.tokens(&row);
            let over = config
                .max_batch_tokens
                .is_some_and(|budget| part_tokens + tokens > budget);
            if !part.is_empty() && (part.len() == config.max_batch_size || over) {
                tickets.push(
                    batcher.submit(HostTensor::concat(std::mem::take(&mut part))?, deadline)?,
                );
                part_tokens = 0;
            }
            part_tokens += tokens;
            part.push(row);
        }
        if !part.is_empty() {
            tickets.push(batcher.submit(HostTensor::concat(part)?, deadline)?);
        }
        Ok(tickets)
    }

    fn row(&self, ids: &[i64]) -> HostTensor {
        let mut row = vec![self.model.pad_id; self.width];
        row[..ids.len()].copy_from_slice(ids);
        HostTensor::new(vec![1, self.width], HostData::I64(row)).expect("one row of the width")
    }
}

/// The answers' rows, in order, each `[hidden]`; unit-length when `normalize`.
pub(crate) fn rows_of(
    outputs: Vec<HostTensor>,
    normalize: bool,
) -> Result<Vec<Vec<f32>>, ServeError> {
    let mut rows = Vec::new();
    for output in outputs {
        let width = output.row_len();
        let HostData::F32(values) = output.into_data() else {
            return Err(ServeError::Model(
                "the embedding model answered non-FP32 rows".into(),
            ));
        };
        for chunk in values.chunks(width.max(1)) {
            let mut row = chunk.to_vec();
            if normalize {
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                // A zero row (a text of padding alone) stays zero, as sentence-transformers'.
                if norm > 0.0 {
                    row.iter_mut().for_each(|v| *v /= norm);
                }
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

impl Embedded {
    pub(crate) fn new(rows: Vec<Vec<f32>>, ids: &[Vec<i64>]) -> Self {
        Self {
            rows,
            tokens: ids.iter().map(Vec::len).sum(),
        }
    }
}
