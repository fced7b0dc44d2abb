//! The language-model study's pieces: an English corpus read as characters, and a small causal
//! transformer built from burn-compress's blocks, whose linear layers are dense, sketched or
//! low-rank by configuration; [`profile`] records a few of its training steps, and [`report`]
//! writes the study's results (tables, CSV, curves, JSON).

pub mod profile;
pub mod report;

use std::path::{Path, PathBuf};

use burn::config::Config;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_compress::{
    AnyLinear, AnyLinearConfig, AttentionKind, LinearKind, TransformerBlock, TransformerBlockConfig,
};
use burn_fused::{fused_cross_entropy, fused_layer_norm_module};
use burn_memory::{Layers, MemoryError, SegmentSeeds, Segments, segmented_backward};
use burn_profiler::scope;
use burn_sketch::SketchBackend;
use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{Rng, SeedableRng};

/// Where Debian's `fortunes` package puts its English text.
pub const FORTUNES_DIR: &str = "/usr/share/games/fortunes";

/// Why a corpus could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The default corpus is not installed.
    #[error(
        "no corpus at {0}: install it with `apt-get install fortunes` (Debian), or pass \
         `--text PATH` with any UTF-8 text file"
    )]
    Missing(PathBuf),
    /// Reading a file failed.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is too short to train and validate on.
    #[error("the corpus has {0} characters; at least {1} are needed")]
    TooShort(usize, usize),
}

/// A character-level corpus: its vocabulary and the train and validation token streams.
///
/// Characters outside printable ASCII (and newline) become one "other" token, so the vocabulary
/// is small and the same for any English text.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// The train stream.
    pub train: Vec<u32>,
    /// The validation stream.
    pub valid: Vec<u32>,
}

/// Newline, printable ASCII (95 characters), and one token for everything else.
pub const VOCAB: usize = 1 + 95 + 1;

fn token(c: char) -> u32 {
    match c {
        '\n' => 0,
        ' '..='~' => 1 + (c as u32 - ' ' as u32),
        _ => (VOCAB - 1) as u32,
    }
}

impl Corpus {
    /// Reads every text file of the `fortunes` package (the files without an extension,
    /// in name order), each split into its `%`-separated fortunes.
    pub fn read_fortunes(dir: &Path) -> Result<Vec<String>, CorpusError> {
        if !dir.is_dir() {
            return Err(CorpusError::Missing(dir.to_path_buf()));
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CorpusError::Io { path, source }
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.is_file() && path.extension().is_none())
            .collect();
        files.sort();
        let mut documents = Vec::new();
        for path in files {
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let text = String::from_utf8_lossy(&bytes);
            documents.extend(
                text.split("\n%\n")
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(|d| format!("{d}\n\n")),
            );
        }
        if documents.is_empty() {
            return Err(CorpusError::Missing(dir.to_path_buf()));
        }
        Ok(documents)
    }

    /// Reads any text file as documents separated by blank lines.
    pub fn read_text(path: &Path) -> Result<Vec<String>, CorpusError> {
        let bytes = std::fs::read(path).map_err(|source| CorpusError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(String::from_utf8_lossy(&bytes)
            .split("\n\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| format!("{}\n\n", d.trim()))
            .collect())
    }

    /// Splits documents deterministically: every `valid_every`-th document (by position) is
    /// validation, the rest train. Whole documents, so no text is in both.
    pub fn split(
        documents: &[String],
        valid_every: usize,
        min_chars: usize,
    ) -> Result<Self, CorpusError> {
        let (mut train, mut valid) = (Vec::new(), Vec::new());
        for (i, document) in documents.iter().enumerate() {
            let into = if i % valid_every == valid_every - 1 {
                &mut valid
            } else {
                &mut train
            };
            into.extend(document.chars().map(token));
        }
        let short = train.len().min(valid.len());
        if short < min_chars {
            return Err(CorpusError::TooShort(short, min_chars));
        }
        Ok(Self { train, valid })
    }
}

/// A batch of `[batch, context]` windows and their next characters.
pub struct Batch<B: Backend> {
    /// Input tokens, `[batch, context]`.
    pub inputs: Tensor<B, 2, Int>,
    /// Target tokens (the inputs shifted by one), `[batch, context]`.
    pub targets: Tensor<B, 2, Int>,
}

/// Windows of `stream` starting at `starts`, as a batch on `device`.
pub fn batch<B: Backend>(
    stream: &[u32],
    starts: &[usize],
    context: usize,
    device: &B::Device,
) -> Batch<B> {
    let take = |offset: usize| {
        let tokens: Vec<i64> = starts
            .iter()
            .flat_map(|&s| {
                stream[s + offset..s + offset + context]
                    .iter()
                    .map(|&t| t as i64)
            })
            .collect();
        Tensor::from_data(TensorData::new(tokens, [starts.len(), context]), device)
    };
    Batch {
        inputs: take(0),
        targets: take(1),
    }
}

/// A small deterministic generator for batch positions (SplitMix64), so that every arm of the
/// study with the same seed sees the same batches.
#[derive(Debug, Clone)]
pub struct Positions(SplitMix64);

impl Positions {
    /// A generator for `seed` (its state starts at `seed ^ γ`, which the study's figures were
    /// measured with).
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15))
    }

    /// `count` window starts in a stream of `len` tokens for windows of `context + 1`.
    pub fn starts(&mut self, count: usize, len: usize, context: usize) -> Vec<usize> {
        (0..count)
            .map(|_| (self.0.next_u64() % (len - context - 1) as u64) as usize)
            .collect()
    }
}

/// Configuration of a [`TransformerLm`].
#[derive(Config, Debug)]
pub struct TransformerLmConfig {
    /// Vocabulary size.
    #[config(default = "VOCAB")]
    pub vocab: usize,
    /// Context length (learned positions).
    #[config(default = 128)]
    pub context: usize,
    /// Model width.
    #[config(default = 128)]
    pub d_model: usize,
    /// Attention heads.
    #[config(default = 4)]
    pub n_heads: usize,
    /// Transformer blocks.
    #[config(default = 4)]
    pub n_blocks: usize,
    /// MLP hidden width.
    #[config(default = 512)]
    pub d_ff: usize,
    /// Dropout (attention weights, MLP, residual branches, embeddings).
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Softmax or Performer attention.
    #[config(default = "AttentionKind::Softmax")]
    pub attention: AttentionKind,
    /// The kind of the attention projections.
    #[config(default = "LinearKind::Dense")]
    pub projections: LinearKind,
    /// The kind of the MLP layers.
    #[config(default = "LinearKind::Dense")]
    pub mlp: LinearKind,
}

impl TransformerLmConfig {
    /// Builds the model, every parameter drawn now from the backend's generator.
    pub fn init<B: Backend>(&self, device: &B::Device) -> TransformerLm<B> {
        let block = TransformerBlockConfig::new(self.d_model, self.n_heads, self.d_ff)
            .with_dropout(self.dropout)
            .with_causal(true)
            .with_attention(self.attention)
            .with_projections(self.projections)
            .with_mlp(self.mlp);
        let model = TransformerLm {
            tokens: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            positions: EmbeddingConfig::new(self.context, self.d_model).init(device),
            blocks: (0..self.n_blocks).map(|_| block.init(device)).collect(),
            norm: LayerNormConfig::new(self.d_model).init(device),
            head: AnyLinearConfig::new(self.d_model, self.vocab).init(device),
            dropout: burn::nn::DropoutConfig::new(self.dropout).init(),
        };
        // Burn draws a parameter on its first use: draw them all now, in module order, so that
        // a model built after `B::seed` does not depend on which of its layers runs first, and
        // later draws (dropout masks) do not depend on whether the model was used before.
        burn_memory::draw_params(&model);
        model
    }
}

/// A GPT-style character model: token and position embeddings, pre-norm blocks, a final
/// layer norm and a dense output head.
#[derive(Module, Debug)]
pub struct TransformerLm<B: Backend> {
    /// Token embeddings.
    pub tokens: Embedding<B>,
    /// Learned position embeddings.
    pub positions: Embedding<B>,
    /// The blocks.
    pub blocks: Vec<TransformerBlock<B>>,
    /// Final layer norm.
    pub norm: LayerNorm<B>,
    /// Output head (dense: `d_model × vocab` is small).
    pub head: AnyLinear<B>,
    /// Dropout on the embeddings.
    pub dropout: burn::nn::Dropout,
}

/// The profiler scopes of the first blocks (`block 1`…), written out so that naming a block
/// costs no allocation when no profiler runs; later blocks share the scope `block`.
const BLOCK_SCOPES: [&str; 12] = [
    "block 1", "block 2", "block 3", "block 4", "block 5", "block 6", "block 7", "block 8",
    "block 9", "block 10", "block 11", "block 12",
];

/// The parts of the model run in burn-memory profiler scopes (`embedding`, `block 1`…,
/// `head`), which name them in `language_model --profile`'s table, trace and memory peak and
/// cost an atomic load each otherwise.
impl<B: SketchBackend> TransformerLm<B> {
    /// Token and position embeddings, `[batch, seq, d_model]`.
    pub fn embed(&self, inputs: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let _scope = scope("embedding");
        let [batch, seq] = inputs.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &inputs.device())
            .reshape([1, seq])
            .expand([batch, seq]);
        self.dropout
            .forward(self.tokens.forward(inputs) + self.positions.forward(positions))
    }

    /// The mean cross-entropy (nats per character) of the head's predictions for `hidden`.
    pub fn loss(&self, hidden: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let _scope = scope("head");
        let [batch, seq, _] = hidden.dims();
        // The final norm and the loss as one fused operation each (burn-fused): the loss keeps
        // one log-sum-exp per position for its backward, not the probabilities.
        let logits = self
            .head
            .forward(fused_layer_norm_module(&self.norm, hidden));
        let vocab = logits.dims()[2];
        fused_cross_entropy(
            logits.reshape([batch * seq, vocab]),
            targets.reshape([batch * seq]),
            None,
        )
    }

    /// The next character's logits `[batch, vocab]` after each sequence of `tokens`
    /// `[batch, seq]` (what the serving example answers).
    pub fn next_logits(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, seq] = tokens.dims();
        let hidden = self.num_layers_forward(self.embed(tokens));
        let last = hidden.slice([0..batch, seq - 1..seq]);
        let logits = self.head.forward(fused_layer_norm_module(&self.norm, last));
        let vocab = logits.dims()[2];
        logits.reshape([batch, vocab])
    }

    /// The whole model's loss on a batch.
    pub fn forward_loss(&self, batch: &Batch<B>) -> Tensor<B, 1> {
        let hidden = self.num_layers_forward(self.embed(batch.inputs.clone()));
        self.loss(hidden, batch.targets.clone())
    }

    fn num_layers_forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        (0..self.blocks.len()).fold(x, |x, index| self.forward_layer(index, x))
    }
}

/// The blocks are the layers that segment checkpointing splits; the embeddings come before
/// and the head after (in the loss).
impl<B: SketchBackend> Layers<B, Tensor<B, 3>> for TransformerLm<B> {
    fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    fn forward_layer(&self, index: usize, input: Tensor<B, 3>) -> Tensor<B, 3> {
        let _scope = scope(BLOCK_SCOPES.get(index).copied().unwrap_or("block"));
        self.blocks[index].forward(input, None)
    }
}

impl<B: AutodiffBackend + SketchBackend> TransformerLm<B> {
    /// A training step's gradients with segment checkpointing over the blocks (burn-memory's
    /// `segmented_backward`): the embeddings' graph is kept, the blocks' activations are
    /// recomputed segment by segment, the head runs in the last segment's loss.
    pub fn segmented_grads(
        &self,
        batch: &Batch<B>,
        segments: &Segments,
    ) -> Result<GradientsParams, MemoryError> {
        let embedded = self.embed(batch.inputs.clone());
        // A leaf of its own, so that the step returns its gradient (Burn marks only leaves as
        // requiring one); the embeddings' graph stays with `embedded`.
        let input = embedded.clone().detach().require_grad();
        let step = segmented_backward(self, input, segments, |hidden| {
            self.loss(hidden, batch.targets.clone())
        })?;
        let mut grads = GradientsAccumulator::new();
        grads.accumulate(self, step.grads);
        if let Some(upstream) = step.input_grad {
            // The embeddings' share: their output's gradient is the first segment's input's.
            let rest = (embedded * Tensor::from_inner(upstream)).sum().backward();
            grads.accumulate(self, GradientsParams::from_grads(rest, self));
        }
        Ok(grads.grads())
    }

    /// The plain backward (one graph over the whole model) that draws the dropout masks
    /// [`segmented_grads`](Self::segmented_grads) draws when the backend's generator is in the
    /// same state: the same first draw gives the segment seeds, and each segment's blocks run
    /// after seeding with its own.
    pub fn replayed_grads(
        &self,
        batch: &Batch<B>,
        segments: &Segments,
    ) -> Result<GradientsParams, MemoryError> {
        let device = batch.inputs.device();
        let mut hidden = self.embed(batch.inputs.clone());
        let seeds = SegmentSeeds::draw::<B>(&device)?;
        for (i, range) in segments.ranges(self.blocks.len())?.into_iter().enumerate() {
            B::seed(&device, seeds.segment(i));
            for index in range {
                hidden = self.forward_layer(index, hidden);
            }
        }
        B::seed(&device, seeds.after());
        let loss = self.loss(hidden, batch.targets.clone());
        Ok(GradientsParams::from_grads(loss.backward(), self))
    }
}

/// How far gradients `b` are from `a`: the largest `max|a − b| / scale` over the model's
/// parameters (infinite when one side lacks a parameter's gradient), where a parameter's scale
/// is its largest `|a|`, but at least [`NOISE_FLOOR`] times the largest `|a|` of the model.
///
/// Why the floor: some gradients are zero in exact arithmetic and hold only rounding noise
/// (the attention's key bias: softmax ignores a constant added to all of a query's scores),
/// and noise measured against noise says nothing about the computation.
pub fn max_rel_diff<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    a: &GradientsParams,
    b: &GradientsParams,
) -> f64 {
    struct Diff<'a, B> {
        a: &'a GradientsParams,
        b: &'a GradientsParams,
        /// Per parameter: (largest |a|, largest |a − b|).
        found: Vec<(f64, f64)>,
        missing: bool,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Diff<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let x = self.a.get::<B::InnerBackend, D>(param.id);
            let y = self.b.get::<B::InnerBackend, D>(param.id);
            let (Some(x), Some(y)) = (x.clone(), y.clone()) else {
                self.missing |= x.is_some() != y.is_some();
                return;
            };
            let scale = x.clone().abs().max().into_scalar().elem::<f64>();
            let diff = (x - y).abs().max().into_scalar().elem::<f64>();
            self.found.push((scale, diff));
        }
    }
    let mut diff = Diff {
        a,
        b,
        found: Vec::new(),
        missing: false,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut diff);
    if diff.missing {
        return f64::INFINITY;
    }
    let floor = NOISE_FLOOR * diff.found.iter().map(|f| f.0).fold(0.0, f64::max);
    diff.found
        .iter()
        .filter(|(scale, _)| *scale > 0.0)
        .map(|&(scale, d)| d / scale.max(floor))
        .fold(0.0, f64::max)
}

/// The smallest scale [`max_rel_diff`] measures a parameter's gradient against, relative to
/// the model's largest gradient.
pub const NOISE_FLOOR: f64 = 1e-4;
