//! A BERT-family sentence encoder (all-MiniLM-L6-v2, any directory `load_hf` reads, or a
//! compressed copy), served as an embedding model: token ids or texts in, sentence embeddings
//! out, pooled and normalized as the directory's sentence-transformers files say.
//!
//! # The rows
//!
//! burn-serve's batcher concatenates requests whose rows have one shape, and a served model
//! takes one input tensor. So a row is [`ENCODER_INPUT`] `INT64 [max_length]`: the text's
//! token ids, `[CLS]` and `[SEP]` included, then padding id 0 up to `max_length`. BERT's
//! `[PAD]` is id 0 and no real token has it, so id 0 *is* the attention mask: no
//! `attention_mask` input is needed (burn-serve's models take one input). Each replica sorts
//! a batch's rows by length, runs them in groups of similar length (`length_groups`), each
//! cut to its longest real row, and puts the embeddings back in order: a batch costs about
//! what its real tokens cost, whatever `max_length` is and however mixed its lengths. Padding
//! changes nothing else, as padded keys are masked out of attention and padded states out of
//! the mean.
//!
//! Texts are tokenized by the server ([`ServedTokenizer`], burn-serve's `TextModel`): the
//! same rows, made from a `BYTES` input or the embedding endpoints' texts.
//!
//! A row of padding alone (no token) gets the zero vector, as sentence-transformers' pooling
//! gives. An id outside the vocabulary fails its own request with a 400 naming it: the
//! replica's validator checks each request before burn-serve batches it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use burn::config::Config;
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use burn_fast_cpu::FastFlex;
use burn_memory::offload::{OffloadConfig, OffloadManager, OffloadSelection, OffloadedModel};
use burn_memory::{DeviceMemory, Layers};
use burn_pretrained::{BertConfig, BertEncoder, EncoderInput, Pooling, Tokenizer};
use burn_serve::{
    CountTokens, DataType, Encoded, HostData, HostTensor, ModelSpec, Servable, ServeError,
    TensorSpec, Token, Tokenize,
};
use burn_sketch::SketchBackend;
use burn_store::{BurnpackStore, ModuleSnapshot, SafetensorsStore};

/// The served model's name.
pub const ENCODER_MODEL: &str = "minilm";
/// Its input: token ids, `INT64 [-1, max_length]`, padded with 0 at the end.
pub const ENCODER_INPUT: &str = "input_ids";
/// Its output: unit-length sentence embeddings, `FP32 [-1, hidden]`.
pub const ENCODER_OUTPUT: &str = "embeddings";

/// The encoder's signature: `input_ids` `INT64 [-1, max_length]` to `embeddings`
/// `FP32 [-1, hidden]`. `platform` says what runs it (`burn-fastflex-int8`), which is where
/// the metadata endpoint tells the form.
pub fn encoder_spec(platform: &str, max_length: usize, hidden: usize) -> ModelSpec {
    ModelSpec {
        name: ENCODER_MODEL.into(),
        version: "1".into(),
        platform: platform.into(),
        input: TensorSpec::rows(ENCODER_INPUT, DataType::Int64, &[max_length]),
        output: TensorSpec::rows(ENCODER_OUTPUT, DataType::Fp32, &[hidden]),
    }
}

/// Texts as request rows: `tokenizer`'s ids of each, padded with 0 to `max_length` (the
/// tokenizer must cut at most there: build it with `max_length`).
pub fn id_rows<S: AsRef<str>>(
    tokenizer: &Tokenizer,
    texts: &[S],
    max_length: usize,
) -> anyhow::Result<HostTensor> {
    let batch = tokenizer.encode(texts)?;
    if batch.seq > max_length {
        bail!(
            "the tokenizer cuts at {} tokens, the rows hold {max_length}",
            tokenizer.max_length()
        );
    }
    let mut ids = vec![0i64; batch.batch * max_length];
    for (row, &length) in batch.lengths.iter().enumerate() {
        ids[row * max_length..row * max_length + length]
            .copy_from_slice(&batch.ids[row * batch.seq..row * batch.seq + length]);
    }
    Ok(HostTensor::new(
        vec![batch.batch, max_length],
        HostData::I64(ids),
    )?)
}

/// A batch of id rows made ready for the encoder: cut to its longest real row, with the
/// padding mask, and the rows that hold no token.
#[derive(Debug, PartialEq)]
struct Trimmed {
    ids: Vec<i64>,
    seq: usize,
    /// `true` at padding, `[rows, seq]`.
    pad: Vec<bool>,
    /// Rows of padding alone: their position 0 is left unmasked (attention over no key is
    /// undefined) and their embedding is set to zero afterwards.
    empty: Vec<usize>,
}

/// Each row's real ids: up to its last nonzero id (id 0 is padding).
fn row_lengths(ids: &[i64], width: usize) -> Vec<usize> {
    ids.chunks(width)
        .map(|row| {
            row.iter()
                .rposition(|&id| id != 0)
                .map_or(0, |last| last + 1)
        })
        .collect()
}

/// Every id of `ids` (rows of `width`) within a vocabulary of `vocab`: the check each request
/// passes before it is batched, and each batch again before it runs.
fn check_ids(ids: &[i64], width: usize, vocab: usize) -> Result<(), ServeError> {
    match ids
        .iter()
        .enumerate()
        .find(|&(_, &id)| id < 0 || id as u64 >= vocab as u64)
    {
        Some((at, &id)) => Err(ServeError::BadRequest(format!(
            "token id {id} (row {}, position {}) is outside the vocabulary of {vocab}",
            at / width.max(1),
            at % width.max(1)
        ))),
        None => Ok(()),
    }
}

/// Cuts `rows` rows of `width` ids to the longest real row (id 0 is padding) and checks
/// every id against the vocabulary.
fn trim(ids: &[i64], rows: usize, width: usize, vocab: usize) -> Result<Trimmed, ServeError> {
    if width == 0 || ids.len() != rows * width {
        return Err(ServeError::BadRequest(format!(
            "{} ids do not make {rows} rows of at least one id",
            ids.len()
        )));
    }
    check_ids(ids, width, vocab)?;
    let lengths = row_lengths(ids, width);
    let seq = lengths.iter().copied().max().unwrap_or(0).max(1);
    let mut kept = Vec::with_capacity(rows * seq);
    let mut pad = Vec::with_capacity(rows * seq);
    let mut empty = Vec::new();
    for (row, &length) in lengths.iter().enumerate() {
        let row_ids = &ids[row * width..row * width + seq];
        kept.extend_from_slice(row_ids);
        pad.extend(row_ids.iter().map(|&id| id == 0));
        if length == 0 {
            empty.push(row);
            pad[row * seq] = false;
        }
    }
    Ok(Trimmed {
        ids: kept,
        seq,
        pad,
        empty,
    })
}

/// The encoder as burn-memory's [`Layers`]: the embeddings, then each encoder layer, so that
/// an offloaded copy runs with one layer's weights on the device at a time. A module of its
/// own because both the trait and `BertEncoder` are other crates'.
#[derive(Module, Debug)]
pub struct LayeredEncoder<B: Backend> {
    /// The encoder.
    pub encoder: BertEncoder<B>,
}

/// What one layer passes to the next: the batch (ids and padding mask) and the hidden states
/// once the embeddings have made them.
pub type EncoderPass<B> = (EncoderInput<B>, Option<Tensor<B, 3>>);

impl<B: SketchBackend> Layers<B, EncoderPass<B>> for LayeredEncoder<B> {
    fn num_layers(&self) -> usize {
        1 + self.encoder.layers.len()
    }

    fn forward_layer(&self, index: usize, (input, hidden): EncoderPass<B>) -> EncoderPass<B> {
        let next = match (index, hidden) {
            (0, _) => self.encoder.embeddings.forward(&input),
            (layer, Some(hidden)) => {
                self.encoder.layers[layer - 1].forward(hidden, input.mask_pad.clone())
            }
            (_, None) => unreachable!("layer 0, the embeddings, makes the hidden states"),
        };
        (input, Some(next))
    }
}

/// Where a replica's weights are (both boxed: a model is a large struct of handles).
enum Weights {
    /// On the device, whole.
    Resident(Box<BertEncoder<FastFlex>>),
    /// On burn-memory's offload tiers, one layer on the device at a time.
    Offloaded(Box<OffloadedModel<FastFlex, LayeredEncoder<FastFlex>>>),
}

/// One replica of the served encoder: a batch of id rows to its embeddings, pooled as the
/// model directory says.
pub struct EncoderReplica {
    weights: Weights,
    pooling: Pooling,
    device: Device<FastFlex>,
    vocab: usize,
    hidden: usize,
    in_use: Option<u64>,
    read_at: Option<Instant>,
}

impl std::fmt::Debug for EncoderReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderReplica")
            .field("offloaded", &self.is_offloaded())
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

impl EncoderReplica {
    /// `workers` replicas of `encoder`, whose weights they share (a clone of a Burn module
    /// shares its tensors).
    pub fn resident(encoder: BertEncoder<FastFlex>, pooling: Pooling, workers: usize) -> Vec<Self> {
        let (vocab, hidden) = (encoder.vocab_size(), encoder.hidden_size());
        (0..workers.max(1))
            .map(|_| Self {
                weights: Weights::Resident(Box::new(encoder.clone())),
                pooling,
                device: Default::default(),
                vocab,
                hidden,
                in_use: None,
                read_at: None,
            })
            .collect()
    }

    /// One replica of `encoder` (built from `config`) on burn-memory's offload tiers within
    /// `budget` device bytes: the encoder is written once to `dir` as safetensors, and its
    /// embeddings and linear layers are read from the memory-mapped file to the host tier,
    /// one layer on the device at a time. Float weights only (`f32`, `bf16`, low-rank):
    /// `int8` layers are not offloaded.
    pub fn offloaded(
        encoder: BertEncoder<FastFlex>,
        pooling: Pooling,
        config: &BertConfig,
        dir: &Path,
        budget: u64,
    ) -> anyhow::Result<Self> {
        let device: Device<FastFlex> = Default::default();
        let (vocab, hidden) = (encoder.vocab_size(), encoder.hidden_size());
        std::fs::create_dir_all(dir)?;
        let path = dir.join("minilm-offload.safetensors");
        LayeredEncoder { encoder }
            .save_into(&mut SafetensorsStore::from_file(&path).overwrite(true))
            .with_context(|| format!("cannot write {}", path.display()))?;
        let manager = OffloadManager::<FastFlex>::new(
            OffloadConfig::new().with_device_budget_bytes(Some(budget)),
            &device,
        )?;
        let template = LayeredEncoder {
            encoder: config.try_init::<FastFlex>(&device)?,
        };
        let selection =
            OffloadSelection::types(["Embedding", "Linear", "LowRankLinear", "SkLinear"]);
        let model = manager
            .wrap_checkpoint(template, &path, &selection)
            .map_err(|wrap| wrap.error)?;
        Ok(Self {
            weights: Weights::Offloaded(Box::new(model)),
            pooling,
            device,
            vocab,
            hidden,
            in_use: None,
            read_at: None,
        })
    }

    /// Whether the weights are on the offload tiers.
    pub fn is_offloaded(&self) -> bool {
        matches!(self.weights, Weights::Offloaded(_))
    }

    /// The embeddings of a batch of id rows, `[rows, hidden]` row-major. The rows run in
    /// groups of similar length (`length_groups`), each cut to its longest row, so that a
    /// batch of mixed lengths is not padded to its longest text.
    pub fn embed_rows(&self, ids: &[i64], rows: usize) -> Result<Vec<f32>, ServeError> {
        if rows == 0 || ids.is_empty() || !ids.len().is_multiple_of(rows) {
            return Err(ServeError::BadRequest(format!(
                "{} ids do not make {rows} rows of at least one id",
                ids.len()
            )));
        }
        let width = ids.len() / rows;
        let groups = length_groups(&row_lengths(ids, width));
        if groups.len() == 1 {
            return self.embed_group(ids, rows, width);
        }
        let mut out = vec![0.0f32; rows * self.hidden];
        for group in groups {
            let group_ids: Vec<i64> = group
                .iter()
                .flat_map(|&row| ids[row * width..(row + 1) * width].iter().copied())
                .collect();
            let values = self.embed_group(&group_ids, group.len(), width)?;
            for (&row, embedding) in group.iter().zip(values.chunks(self.hidden)) {
                out[row * self.hidden..(row + 1) * self.hidden].copy_from_slice(embedding);
            }
        }
        Ok(out)
    }

    /// One forward of `rows` rows of `width` ids, cut to the longest.
    fn embed_group(&self, ids: &[i64], rows: usize, width: usize) -> Result<Vec<f32>, ServeError> {
        let trimmed = trim(ids, rows, width, self.vocab)?;
        let shape = [rows, trimmed.seq];
        let input = EncoderInput {
            ids: Tensor::<FastFlex, 2, Int>::from_data(
                TensorData::new(trimmed.ids, shape),
                &self.device,
            ),
            type_ids: None,
            mask_pad: trimmed.pad.iter().any(|&p| p).then(|| {
                Tensor::<FastFlex, 2, Bool>::from_data(
                    TensorData::new(trimmed.pad, shape),
                    &self.device,
                )
            }),
        };
        let hidden = match &self.weights {
            Weights::Resident(encoder) => encoder.forward(&input),
            Weights::Offloaded(model) => model
                .forward_layers((input.clone(), None))
                .map_err(|error| ServeError::Model(error.to_string()))?
                .1
                .ok_or_else(|| ServeError::Model("the encoder has no layer".into()))?,
        };
        let mut values = self
            .pooling
            .apply(hidden, input.mask_pad)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|error| ServeError::Model(format!("{error:?}")))?;
        if values.len() != rows * self.hidden {
            return Err(ServeError::Model(format!(
                "{} values for {rows} rows of {}",
                values.len(),
                self.hidden
            )));
        }
        for &row in &trimmed.empty {
            values[row * self.hidden..(row + 1) * self.hidden].fill(0.0);
        }
        Ok(values)
    }
}

/// Padding allowed in a group of [`length_groups`], as a fraction of its real tokens.
const PADDING_ALLOWANCE: f64 = 0.25;

/// The rows (given their real lengths) in groups of similar length, shortest first: a row
/// joins the current group while the group, cut to its longest row, computes at most a
/// quarter more tokens than it holds. The encoder's cost grows with rows × longest row, so a
/// batch of fortunes padded to its longest would cost several times its tokens.
fn length_groups(lengths: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&row| lengths[row]);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut tokens = 0usize;
    for row in order {
        let length = lengths[row].max(1);
        let fits = groups.last().is_some_and(|group| {
            let padded = (group.len() + 1) * length;
            padded as f64 <= (1.0 + PADDING_ALLOWANCE) * (tokens + length) as f64
        });
        if fits {
            groups.last_mut().expect("checked").push(row);
            tokens += length;
        } else {
            groups.push(vec![row]);
            tokens = length;
        }
    }
    groups
}

/// How often a replica reads the device's memory for the metrics (a system call on CPU).
const MEMORY_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

impl Servable for EncoderReplica {
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        let rows = batch.rows();
        let HostData::I64(ids) = batch.into_data() else {
            return Err(ServeError::BadRequest(format!(
                "{ENCODER_INPUT} must be INT64 token ids"
            )));
        };
        let values = self.embed_rows(&ids, rows)?;
        if self.read_at.is_none_or(|at| at.elapsed() >= MEMORY_PERIOD) {
            self.in_use = FastFlex::memory_usage(&self.device, FastFlex::current_stream())
                .ok()
                .map(|usage| usage.in_use);
            self.read_at = Some(Instant::now());
        }
        HostTensor::f32(rows, self.hidden, values)
    }

    fn validator(&self) -> Option<burn_serve::Validate> {
        let vocab = self.vocab;
        Some(std::sync::Arc::new(move |input: &HostTensor| {
            let HostData::I64(ids) = input.data() else {
                return Err(ServeError::BadRequest(format!(
                    "{ENCODER_INPUT} must be INT64 token ids"
                )));
            };
            check_ids(ids, input.row_len(), vocab)
        }))
    }

    fn token_count(&self) -> Option<CountTokens> {
        // A batch costs its real tokens: the replica cuts padding away (`length_groups`).
        Some(std::sync::Arc::new(|input: &HostTensor| {
            match input.data() {
                HostData::I64(ids) => row_lengths(ids, input.row_len().max(1)).iter().sum(),
                other => other.len(),
            }
        }))
    }

    fn memory_in_use(&self) -> Option<u64> {
        self.in_use
    }
}

/// The model directory's tokenizer as the server runs it ([`Tokenize`]): ids cut at the
/// model's length as `SentenceEncoder` cuts them, and `/tokenize`'s tokens uncut.
#[derive(Debug)]
pub struct ServedTokenizer {
    cut: Tokenizer,
    uncut: tokenizers::Tokenizer,
}

impl ServedTokenizer {
    /// Serves `tokenizer` (which cuts at its `max_length`).
    pub fn new(tokenizer: Tokenizer) -> anyhow::Result<Self> {
        let mut uncut = tokenizer.inner().clone();
        uncut
            .with_truncation(None)
            .map_err(|error| anyhow::anyhow!("{error}"))?;
        uncut.with_padding(None);
        Ok(Self {
            cut: tokenizer,
            uncut,
        })
    }
}

impl Tokenize for ServedTokenizer {
    fn encode(&self, text: &str) -> Result<Encoded, ServeError> {
        let encoding = self
            .cut
            .inner()
            .encode(text, true)
            .map_err(|error| ServeError::BadRequest(format!("cannot tokenize: {error}")))?;
        Ok(Encoded {
            ids: encoding.get_ids().iter().map(|&id| i64::from(id)).collect(),
            truncated: !encoding.get_overflowing().is_empty(),
        })
    }

    fn tokens(&self, text: &str, add_special_tokens: bool) -> Result<Vec<Token>, ServeError> {
        let encoding = self
            .uncut
            .encode(text, add_special_tokens)
            .map_err(|error| ServeError::BadRequest(format!("cannot tokenize: {error}")))?;
        Ok(encoding
            .get_ids()
            .iter()
            .zip(encoding.get_tokens())
            .zip(encoding.get_special_tokens_mask())
            .zip(encoding.get_offsets())
            .map(|(((&id, token), &special), &(start, stop))| Token {
                id: i64::from(id),
                text: token.clone(),
                special: special == 1,
                start: (special == 0).then_some(start),
                stop: (special == 0).then_some(stop),
            })
            .collect())
    }

    fn max_length(&self) -> usize {
        self.cut.max_length()
    }
}

/// A compressed or distilled encoder's checkpoint: `path` if it is a Burnpack file, else the
/// one `.bpk` file in the directory `path`. Its [`BertConfig`] (with the layer kinds, so that
/// the layers are built as they were saved) is the `.json` file of the same name beside it.
pub fn checkpoint_file(path: &Path) -> anyhow::Result<PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "bpk"))
        .collect();
    match files.as_slice() {
        [file] => Ok(file.clone()),
        [] => bail!("{} holds no .bpk checkpoint", path.display()),
        _ => bail!(
            "{} holds {} .bpk checkpoints: name one",
            path.display(),
            files.len()
        ),
    }
}

/// Loads an encoder saved by [`crate::save`] (or the distil example): the Burnpack file
/// ([`checkpoint_file`]) into an encoder built from the `BertConfig` JSON beside it.
pub fn load_encoder(
    path: &Path,
    device: &Device<FastFlex>,
) -> anyhow::Result<(BertEncoder<FastFlex>, BertConfig)> {
    let file = checkpoint_file(path)?;
    let config_file = file.with_extension("json");
    let config = BertConfig::load(&config_file).with_context(|| {
        format!(
            "cannot read the BertConfig {} that goes with {}",
            config_file.display(),
            file.display()
        )
    })?;
    let mut encoder = config.try_init::<FastFlex>(device)?;
    let result = encoder
        .load_from(&mut BurnpackStore::from_file(&file))
        .with_context(|| format!("cannot load {}", file.display()))?;
    if !result.errors.is_empty() || !result.missing.is_empty() {
        bail!(
            "{} does not fit its configuration: missing {:?}, errors {:?}",
            file.display(),
            result.missing,
            result.errors
        );
    }
    Ok((encoder, config))
}
