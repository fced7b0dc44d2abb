//! Compress and recover: all-MiniLM-L6-v2's feed-forward layers converted at a fraction of
//! their parameters (low-rank by the randomized SVD, or sketched with a fitted or an unbiased
//! start), then distilled: trained on unlabeled sentences to reproduce the original's hidden
//! states (every layer's output, and the last), with burn-compress's `distil` on
//! `Autodiff<FastFlex>`. Panther's fine-tuning step after a conversion, with no labels.
//!
//! ```text
//! export MINILM_DIR=/tmp/minilm PYTHON=/tmp/venv/bin/python
//! # every method, 10 minutes of distillation each (wall clock), a table and a JSON file
//! cargo run --release -p examples-pretrained --example distil -- --json distil.json
//! # one method, a short run; the distilled encoder saved for the serving example
//! cargo run --release -p examples-pretrained --example distil -- --method low-rank --minutes 1 --save distilled
//! ```
//!
//! The fortunes (deduplicated) are shuffled with `--seed` and split: `--held-out` sentences
//! (1,000) are never trained on; the rest are the training set, tokenized once (at most
//! `--max-length` tokens), sorted by length and cut into batches of `--batch` sentences, so
//! that little of a batch is padding, whose order is shuffled every epoch. Every `--eval-every`
//! seconds of training the mean cosine to the original's embeddings is measured on the first
//! `--eval-slice` held-out sentences (that time is not counted in the budget), to report when
//! it first reaches 0.98. Before and after the distillation, each method's row of the table
//! holds, on the whole held-out set: the feed-forward parameters (dense and converted), the
//! encoder's stored bytes, its embedding speed (sentences/s, batches of 32, FastFlex `f32`),
//! the mean and least cosine of its embeddings to the original's, and the recall of the
//! original's 10 nearest neighbours among the held-out sentences.
//!
//! **Saved model (`--save DIR`).** For each method, `DIR/<method>/encoder.bpk` (the encoder's
//! parameters as a Burnpack file, burn-store's `BurnpackStore`, with burn-compress's layer
//! variants in the paths), `DIR/<method>/encoder.json` (the `BertConfig`, Burn `Config` JSON,
//! whose `ffn_kind` names the converted layers' kind and size so that `BertConfig::init`
//! builds the same layers before the file is loaded into them) and `tokenizer.json` (a copy of
//! the model's). The serving example's `load_encoder` reads the directory.
//!

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::config::Config;
use burn::module::{AutodiffModule, Module};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use burn_compress::{
    Converter, DistilConfig, DistilLoss, LinearKind, LinearLayer, LowRankLinear, Selection, distil,
    stored_bytes,
};
use burn_fast_cpu::FastFlex;
use burn_memory::{Checkpointing, Precision, WithAutodiff};
use burn_pretrained::{BertConfig, BertEncoder, SentenceEncoder, TokenBatch, Tokenizer, load_hf};
use burn_sketch::SketchInit;
use burn_store::{BurnpackStore, ModuleSnapshot};
use clap::Parser;
use examples_pretrained::{cosines, model_dir, recall_at_k, sentences};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Method {
    /// Low-rank `x·A·B`, from the randomized SVD of each weight.
    LowRank,
    /// Low-rank, fitted to the inputs each layer sees on calibration sentences
    /// (`LowRankLinear::try_from_linear_on_inputs`) rather than to its weight.
    LowRankAware,
    /// Sketched, the least-squares fit to the weight (`SketchInit::Fitted`).
    Fitted,
    /// Sketched, Panther's unbiased start (`SketchInit::Unbiased`).
    Unbiased,
    /// The three, one after the other.
    All,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::LowRank => "low-rank",
            Self::LowRankAware => "low-rank-aware",
            Self::Fitted => "fitted",
            Self::Unbiased => "unbiased",
            Self::All => "all",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LossArg {
    /// Squared error over the teacher's variance.
    Mse,
    /// 1 − cosine per token.
    Cosine,
}

#[derive(Debug, Parser)]
#[command(about = "Convert all-MiniLM-L6-v2's feed-forward layers, then distil them back")]
struct Args {
    /// The model directory; default: MINILM_DIR, else the PyPI package through $PYTHON.
    #[arg(long)]
    model: Option<PathBuf>,
    /// A text file of blank-line separated paragraphs (default: the fortunes).
    #[arg(long)]
    text: Option<PathBuf>,
    /// The conversion.
    #[arg(long, value_enum, default_value_t = Method::All)]
    method: Method,
    /// The feed-forward layers' parameters kept, as a fraction of the dense ones.
    #[arg(long, default_value_t = 0.5)]
    fraction: f64,
    /// Train the embeddings too (by default they are frozen: only the layers train).
    #[arg(long)]
    train_embeddings: bool,
    /// Batches of training sentences whose inputs the activation-aware conversion fits.
    #[arg(long, default_value_t = 16)]
    calibration: usize,
    /// Sketched terms T (each of rank k, k from the fraction).
    #[arg(long, default_value_t = 1)]
    terms: usize,
    /// Minutes of distillation per method (training time, evaluations excluded).
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Sentences held apart for evaluation.
    #[arg(long, default_value_t = 1000)]
    held_out: usize,
    /// Held-out sentences of the periodic evaluation.
    #[arg(long, default_value_t = 200)]
    eval_slice: usize,
    /// Seconds of training between periodic evaluations.
    #[arg(long, default_value_t = 30.0)]
    eval_every: f64,
    /// Sentences per training batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Tokens kept per training sentence.
    #[arg(long, default_value_t = 128)]
    max_length: usize,
    /// AdamW's peak learning rate.
    #[arg(long, default_value_t = 5e-4)]
    lr: f64,
    /// The distance between hidden states.
    #[arg(long, value_enum, default_value_t = LossArg::Mse)]
    loss: LossArg,
    /// Weight of the per-layer states (layers 1 to 5).
    #[arg(long, default_value_t = 1.0)]
    layer_weight: f64,
    /// Weight of the output state (layer 6).
    #[arg(long, default_value_t = 1.0)]
    output_weight: f64,
    /// The student's compute precision: f32 or bf16 (master weights f32).
    #[arg(long, default_value = "f32")]
    precision: String,
    /// Activation checkpointing: none or balanced (Burn's `BalancedCheckpointing`).
    #[arg(long, default_value = "none")]
    checkpointing: String,
    /// Seed of the split, the batch order and the sketches.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Write the table's rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Save each distilled encoder under DIR/<method>/ (see the header).
    #[arg(long)]
    save: Option<PathBuf>,
}

/// The fidelity target.
const TARGET_COSINE: f64 = 0.98;
/// Neighbours whose recall is measured.
const K: usize = 10;
/// Sentences per batch when embedding.
const EMBED_BATCH: usize = 32;

/// One encoder's measures on the held-out set.
#[derive(Debug, Clone, Serialize)]
struct Measures {
    sentences_per_s: f64,
    mean_cosine: f64,
    min_cosine: f64,
    recall_at_10: f64,
}

/// One periodic evaluation.
#[derive(Debug, Clone, Serialize)]
struct Point {
    step: usize,
    seconds: f64,
    loss: f32,
    slice_mean_cosine: f64,
}

/// One method's row.
#[derive(Debug, Clone, Serialize)]
struct Row {
    method: &'static str,
    kind: String,
    ffn_params_dense: usize,
    ffn_params: usize,
    stored_bytes_dense: usize,
    stored_bytes: usize,
    before: Measures,
    after: Measures,
    steps: usize,
    train_seconds: f64,
    seconds_to_target: Option<f64>,
    first_loss: f32,
    last_loss: f32,
    curve: Vec<Point>,
}

/// What every method shares: the split, the tokenized batches, the original's embeddings.
struct Shared {
    args: Args,
    dir: PathBuf,
    tokenizer: Tokenizer,
    config: BertConfig,
    held_out: Vec<String>,
    train: Vec<TokenBatch>,
    original: Vec<Vec<f32>>,
    original_measures: Measures,
    dense_bytes: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !(args.fraction > 0.0 && args.fraction <= 1.0) {
        bail!("--fraction {}: in (0, 1]", args.fraction);
    }
    let precision: Precision = args.precision.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let checkpointing: Checkpointing = args
        .checkpointing
        .parse()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let dir = model_dir(args.model.as_deref())?;
    let mut all = sentences(args.text.as_deref())?;
    shuffle(&mut all, args.seed);
    if all.len() <= args.held_out + args.batch {
        bail!(
            "{} sentences: too few for {} held out",
            all.len(),
            args.held_out
        );
    }
    let train_texts = all.split_off(args.held_out);
    let held_out = all;

    let device = Default::default();
    let model =
        load_hf::<FastFlex>(&dir, &device).with_context(|| format!("loading {}", dir.display()))?;
    let config = model.config.clone();
    let tokenizer = model.tokenizer.clone();
    let dense_bytes = stored_bytes(&model.encoder);
    let original_encoder = SentenceEncoder::new(model.encoder, model.tokenizer.clone(), device);
    println!(
        "{} training sentences, {} held out; embedding the held-out set with the original",
        train_texts.len(),
        held_out.len()
    );
    let (original, seconds) = embed(&original_encoder, &held_out, "original")?;
    let original_measures = Measures {
        sentences_per_s: held_out.len() as f64 / seconds,
        mean_cosine: 1.0,
        min_cosine: 1.0,
        recall_at_10: 1.0,
    };
    let cut = Tokenizer::from_file(
        dir.join("tokenizer.json"),
        args.max_length.min(tokenizer.max_length()),
    )?;
    let train = batches(&cut, &train_texts, args.batch)?;

    let methods = match args.method {
        Method::All => vec![
            Method::LowRankAware,
            Method::LowRank,
            Method::Fitted,
            Method::Unbiased,
        ],
        one => vec![one],
    };
    let ctx = Shared {
        args,
        dir,
        tokenizer,
        config,
        held_out,
        train,
        original,
        original_measures,
        dense_bytes,
    };
    let mut rows = Vec::new();
    for method in methods {
        let row = checkpointing.run::<FastFlex, _>(Job {
            ctx: &ctx,
            method,
            precision,
        })?;
        print_table(std::slice::from_ref(&row), &ctx);
        rows.push(row);
    }
    println!();
    println!(
        "all methods (distillation {} min each, {precision:?}, checkpointing {checkpointing}):",
        ctx.args.minutes
    );
    print_table(&rows, &ctx);
    if let Some(path) = &ctx.args.json {
        let out = serde_json::json!({
            "model": ctx.dir,
            "held_out": ctx.held_out.len(),
            "train_sentences": ctx.train.iter().map(|b| b.batch).sum::<usize>(),
            "fraction": ctx.args.fraction,
            "minutes": ctx.args.minutes,
            "lr": ctx.args.lr,
            "loss": format!("{:?}", ctx.args.loss),
            "layer_weight": ctx.args.layer_weight,
            "output_weight": ctx.args.output_weight,
            "batch": ctx.args.batch,
            "precision": format!("{precision:?}"),
            "checkpointing": checkpointing.to_string(),
            "original": ctx.original_measures,
            "rows": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// One method's conversion and distillation, on `Autodiff<FastFlex, C>` for the checkpointing
/// strategy `C` the command line picked.
struct Job<'a> {
    ctx: &'a Shared,
    method: Method,
    precision: Precision,
}

impl WithAutodiff<FastFlex> for Job<'_> {
    type Output = anyhow::Result<Row>;

    fn run<C: CheckpointStrategy>(self) -> anyhow::Result<Row> {
        run_method::<C>(self.ctx, self.method, self.precision)
    }
}

fn run_method<C: CheckpointStrategy>(
    ctx: &Shared,
    method: Method,
    precision: Precision,
) -> anyhow::Result<Row> {
    type Inner = FastFlex;
    let args = &ctx.args;
    let device = Default::default();
    let (h, f) = (ctx.config.hidden_size, ctx.config.intermediate_size);
    let budget = args.fraction * (h * f) as f64 / (h + f) as f64;
    let (kind, init) = match method {
        Method::LowRank | Method::LowRankAware => (
            LinearKind::LowRank {
                rank: budget as usize,
            },
            SketchInit::Fitted,
        ),
        Method::Fitted | Method::Unbiased => {
            let low_rank = (budget / args.terms as f64) as usize;
            let init = match method {
                Method::Fitted => SketchInit::Fitted,
                _ => SketchInit::Unbiased,
            };
            (
                LinearKind::Sketched {
                    num_terms: args.terms,
                    low_rank,
                },
                init,
            )
        }
        Method::All => unreachable!("expanded by main"),
    };
    println!("\n== {}: feed-forward layers {kind}", method.name());
    let loaded = load_hf::<Autodiff<Inner, C>>(&ctx.dir, &device)?;
    let encoder = loaded.encoder.with_dropout(0.0);
    let teacher = encoder.valid();
    <Autodiff<Inner, C> as burn::tensor::backend::Backend>::seed(&device, args.seed);
    let (student, (ffn_dense, ffn_params)) = match (method, kind) {
        (Method::LowRankAware, LinearKind::LowRank { rank }) => {
            let calibration = &ctx.train[..args.calibration.min(ctx.train.len())];
            fit_to_inputs(encoder, &teacher, calibration, rank)?
        }
        _ => {
            let (student, report) = Converter::new()
                .rule(
                    Selection::paths(["layers.*.intermediate", "layers.*.output"]),
                    kind,
                )
                .sketch_init(init)
                .apply(encoder)?;
            (student, report.trainable())
        }
    };
    // The embeddings (11.7 M of the 22.7 M parameters) are not converted and gain little from
    // training; freezing them saves their AdamW update at every step.
    let mut student = student;
    if !args.train_embeddings {
        student.embeddings = student.embeddings.no_grad();
    }
    let stored = stored_bytes(&student);
    let before = measure(ctx, student.valid(), "before")?;
    println!(
        "before: mean cosine {:.4}, recall@10 {:.3}",
        before.mean_cosine, before.recall_at_10
    );

    let loss = match args.loss {
        LossArg::Mse => DistilLoss::NormalizedMse,
        LossArg::Cosine => DistilLoss::Cosine,
    };
    let config = DistilConfig::new()
        .with_learning_rate(args.lr)
        .with_loss(loss)
        .with_layer_weight(args.layer_weight)
        .with_output_weight(args.output_weight)
        .with_max_seconds(Some(args.minutes * 60.0))
        .with_precision(precision)
        .with_seed(args.seed);
    let slice = &ctx.held_out[..args.eval_slice.min(ctx.held_out.len())];
    let slice_original = &ctx.original[..slice.len()];
    let bar = ProgressBar::new((args.minutes * 60.0).ceil() as u64).with_style(
        ProgressStyle::with_template("{msg:>10} {bar:30} {pos}/{len} s [{elapsed}] {prefix}")
            .expect("a valid template"),
    );
    bar.set_message(method.name());
    let mut order: Vec<usize> = (0..ctx.train.len()).collect();
    let mut epoch = usize::MAX;
    let mut curve = Vec::new();
    let mut next_eval = args.eval_every;
    let mut reached: Option<f64> = None;
    let mut eval_error = None;
    let (student, run) = distil(
        &teacher,
        student,
        &config,
        |step| {
            if step / ctx.train.len() != epoch {
                epoch = step / ctx.train.len();
                order = (0..ctx.train.len()).collect();
                shuffle(&mut order, args.seed ^ (epoch as u64 + 1));
            }
            ctx.train[order[step % ctx.train.len()]].to_input::<Autodiff<Inner, C>>(&device)
        },
        |info, student: &BertEncoder<Autodiff<Inner, C>>| {
            bar.set_position(info.seconds as u64);
            bar.set_prefix(format!("step {} loss {:.4}", info.step, info.loss));
            let last = info.seconds >= args.minutes * 60.0;
            if info.seconds >= next_eval || last {
                next_eval += args.eval_every;
                let encoder = SentenceEncoder::new(student.valid(), ctx.tokenizer.clone(), device);
                match encoder.embed_all(slice, EMBED_BATCH, |_| {}) {
                    Ok(rows) => {
                        let c = cosines(&rows, slice_original);
                        let mean = c.iter().sum::<f64>() / c.len() as f64;
                        if mean >= TARGET_COSINE && reached.is_none() {
                            reached = Some(info.seconds);
                        }
                        // indicatif drops `println` when its output is hidden (not a terminal).
                        let line = format!(
                            "  {:>6.0} s  step {:>5}  loss {:.4}  slice mean cosine {mean:.4}",
                            info.seconds, info.step, info.loss
                        );
                        match bar.is_hidden() {
                            true => println!("{line}"),
                            false => bar.println(line),
                        }
                        curve.push(Point {
                            step: info.step,
                            seconds: info.seconds,
                            loss: info.loss,
                            slice_mean_cosine: mean,
                        });
                    }
                    Err(err) => {
                        eval_error = Some(err);
                        return ControlFlow::Break(());
                    }
                }
            }
            ControlFlow::Continue(())
        },
    )?;
    bar.finish();
    if let Some(err) = eval_error {
        return Err(err.into());
    }
    let trained = student.valid();
    let after = measure(ctx, trained.clone(), "after")?;
    if let Some(dir) = &args.save {
        save(
            &trained,
            &ctx.config,
            kind,
            &ctx.dir,
            &dir.join(method.name()),
        )?;
    }
    let (first_loss, last_loss) = run.first_last(20).unwrap_or((f32::NAN, f32::NAN));
    Ok(Row {
        method: method.name(),
        kind: format!("{kind}"),
        ffn_params_dense: ffn_dense,
        ffn_params,
        stored_bytes_dense: ctx.dense_bytes,
        stored_bytes: stored,
        before,
        after,
        steps: run.steps,
        train_seconds: run.seconds,
        seconds_to_target: reached,
        first_loss,
        last_loss,
        curve,
    })
}

/// The encoder with its feed-forward layers low-rank, each fitted to the inputs it sees on the
/// `calibration` batches (their real tokens): the sums `XᵀX` per layer, from the teacher, then
/// `LowRankLinear::try_from_linear_on_inputs`. Returns the student and its feed-forward
/// layers' trainable parameters before and after.
fn fit_to_inputs<B: AutodiffBackend<InnerBackend = FastFlex>>(
    mut encoder: BertEncoder<B>,
    teacher: &BertEncoder<FastFlex>,
    calibration: &[TokenBatch],
    rank: usize,
) -> anyhow::Result<(BertEncoder<B>, (usize, usize))> {
    let device = Default::default();
    let mut grams: Vec<Option<[Tensor<FastFlex, 2>; 2]>> = vec![None; teacher.layers.len()];
    for batch in calibration {
        let input = batch.to_input::<FastFlex>(&device);
        let [b, s] = input.ids.dims();
        let real = input
            .mask_pad
            .clone()
            .map(|pad| pad.bool_not().float().reshape([b, s, 1]));
        let mut x = teacher.embeddings.forward(&input);
        for (layer, gram) in teacher.layers.iter().zip(&mut grams) {
            let trace = layer.forward_traced(x, input.mask_pad.clone());
            let sum = |t: Tensor<FastFlex, 3>| {
                let t = match &real {
                    Some(real) => t * real.clone(),
                    None => t,
                };
                let [_, _, w] = t.dims();
                let rows = t.reshape([b * s, w]);
                rows.clone().transpose().matmul(rows)
            };
            let new = [sum(trace.intermediate_input), sum(trace.output_input)];
            *gram = Some(match gram.take() {
                Some([g1, g2]) => [g1 + new[0].clone(), g2 + new[1].clone()],
                None => new,
            });
            x = trace.output;
        }
    }
    let (mut before, mut after) = (0, 0);
    for (layer, gram) in encoder.layers.iter_mut().zip(grams) {
        let [g1, g2] = gram.context("no calibration batch")?;
        for (linear, g) in [(&mut layer.intermediate, g1), (&mut layer.output, g2)] {
            let LinearLayer::Dense(dense) = linear.layer() else {
                bail!("a feed-forward layer is not dense before the conversion");
            };
            let low_rank =
                LowRankLinear::try_from_linear_on_inputs(dense, rank, Tensor::from_inner(g))?;
            before += linear.num_trainable();
            *linear = low_rank.into();
            after += linear.num_trainable();
        }
    }
    Ok((encoder, (before, after)))
}

/// An encoder's embeddings of the held-out set, timed, against the original's.
fn measure(ctx: &Shared, encoder: BertEncoder<FastFlex>, what: &str) -> anyhow::Result<Measures> {
    let encoder = SentenceEncoder::new(encoder, ctx.tokenizer.clone(), Default::default());
    let (rows, seconds) = embed(&encoder, &ctx.held_out, what)?;
    let c = cosines(&rows, &ctx.original);
    Ok(Measures {
        sentences_per_s: ctx.held_out.len() as f64 / seconds,
        mean_cosine: c.iter().sum::<f64>() / c.len() as f64,
        min_cosine: c.iter().copied().fold(f64::INFINITY, f64::min),
        recall_at_10: recall_at_k(&ctx.original, &rows, K),
    })
}

/// Embeds `texts` after an untimed pass over the first batch, with a progress bar.
fn embed(
    encoder: &SentenceEncoder<FastFlex>,
    texts: &[String],
    what: &str,
) -> anyhow::Result<(Vec<Vec<f32>>, f64)> {
    encoder.embed_all(&texts[..EMBED_BATCH.min(texts.len())], EMBED_BATCH, |_| {})?;
    let bar = ProgressBar::new(texts.len() as u64).with_style(
        ProgressStyle::with_template("{msg:>10} {bar:30} {pos}/{len} ({elapsed}, {per_sec})")
            .expect("a valid template"),
    );
    bar.set_message(what.to_string());
    let start = Instant::now();
    let rows = encoder.embed_all(texts, EMBED_BATCH, |done| bar.set_position(done as u64))?;
    let seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok((rows, seconds))
}

/// The training sentences tokenized by `cut` (which truncates to `--max-length`), sorted by token count and
/// cut into batches of `batch`: each batch is padded only to its own longest.
fn batches(cut: &Tokenizer, texts: &[String], batch: usize) -> anyhow::Result<Vec<TokenBatch>> {
    let mut lengths = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(256) {
        lengths.extend(cut.encode(chunk)?.lengths);
    }
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    order
        .chunks(batch)
        .map(|chunk| {
            let group: Vec<&str> = chunk.iter().map(|&i| texts[i].as_str()).collect();
            Ok(cut.encode(&group)?)
        })
        .collect()
}

/// Writes the encoder as the header describes: `encoder.bpk`, `encoder.json`, `tokenizer.json`.
fn save(
    encoder: &BertEncoder<FastFlex>,
    config: &BertConfig,
    kind: LinearKind,
    model: &Path,
    dir: &Path,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("encoder.bpk");
    let mut store = BurnpackStore::from_file(&file).overwrite(true);
    encoder
        .save_into(&mut store)
        .with_context(|| format!("writing {}", file.display()))?;
    let config = config.clone().with_ffn_kind(kind);
    config
        .save(dir.join("encoder.json"))
        .with_context(|| format!("writing {}", dir.join("encoder.json").display()))?;
    std::fs::copy(model.join("tokenizer.json"), dir.join("tokenizer.json"))
        .with_context(|| format!("copying the tokenizer to {}", dir.display()))?;
    // Read back, so that a file the serving side cannot load is found here.
    let mut check = config.try_init::<FastFlex>(&Default::default())?;
    let result = check.load_from(&mut BurnpackStore::from_file(&file))?;
    if !result.errors.is_empty() || !result.missing.is_empty() {
        bail!("{} does not load back: {result:?}", file.display());
    }
    println!("saved {}", dir.display());
    Ok(())
}

/// A seeded Fisher–Yates shuffle (SplitMix64), the same on every machine.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..items.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

fn print_table(rows: &[Row], ctx: &Shared) {
    println!(
        "{:<9} {:<22} {:>15} {:>13} {:>8} {:>7} {:>7} {:>6} {:>7} {:>7} {:>6} {:>7} {:>10}",
        "method",
        "kind",
        "ffn params",
        "stored MB",
        "sent/s",
        "cos",
        "min",
        "R@10",
        "cos'",
        "min'",
        "R@10'",
        "sent/s'",
        "t→0.98"
    );
    let o = &ctx.original_measures;
    println!(
        "{:<9} {:<22} {:>15} {:>13.1} {:>8.0} {:>7} {:>7} {:>6}",
        "original",
        "dense",
        rows.first().map_or(0, |r| r.ffn_params_dense),
        ctx.dense_bytes as f64 / 1e6,
        o.sentences_per_s,
        "1",
        "1",
        "1"
    );
    for r in rows {
        println!(
            "{:<9} {:<22} {:>15} {:>13.1} {:>8.0} {:>7.4} {:>7.4} {:>6.3} {:>7.4} {:>7.4} {:>6.3} {:>7.0} {:>10}",
            r.method,
            r.kind,
            format!("{}/{}", r.ffn_params, r.ffn_params_dense),
            r.stored_bytes as f64 / 1e6,
            r.before.sentences_per_s,
            r.before.mean_cosine,
            r.before.min_cosine,
            r.before.recall_at_10,
            r.after.mean_cosine,
            r.after.min_cosine,
            r.after.recall_at_10,
            r.after.sentences_per_s,
            r.seconds_to_target
                .map_or("-".to_string(), |s| format!("{s:.0} s"))
        );
    }
    println!(
        "(' = after distillation; t→0.98: training seconds until the evaluation slice's mean cosine reached 0.98)"
    );
}
