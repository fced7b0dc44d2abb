//! The language-model study: does sketching a transformer save memory at comparable quality,
//! at which rank, and does it beat a plain low-rank layer with the same trainable parameters?
//!
//! A character-level causal transformer (4 pre-norm blocks, width 128, 4 heads, context 64) on
//! English text (Debian's `fortunes` package, or `--text PATH`), split deterministically into
//! train and validation documents. Every arm trains from scratch with the same seeds, batches,
//! token budget and optimizer (Adam):
//!
//! - `dense`: every linear layer of the blocks dense;
//! - `sketched-k{8,16,32}`: the attention projections and the MLP layers `SkLinear`, `T = 1`;
//! - `lowrank-r{8,16,32}`: the same layers `x·A·B` with as many trainable parameters as the
//!   sketched arm of the same number (`r = T·k`);
//! - `performer-m64`: dense layers, Performer attention (FAVOR+, 64 random features);
//! - `converted-k16`: the trained dense model sketched (`Converter`, k = 16), evaluated as it
//!   is, and `converted-k16-ft` after `--finetune-steps` more steps; `converted-k16-fitted`
//!   the same with the sketched factors fitted to the dense weights by least squares
//!   (`SketchInit::Fitted`), and `converted-r16` the dense layers made rank 16 by the
//!   randomized SVD (the same trainable size), each with its `-ft`.
//!
//! Then, on the dense arm: segment checkpointing with dropout on (gradients against a plain
//! backward with the same dropout masks, peak and time), bf16 mixed precision, and offloaded
//! inference (blocks streamed from the disk tier).
//!
//! ```text
//! cargo run --release -p examples --example language_model              # the study (~20 min)
//! cargo run --release -p examples --example language_model -- --quick   # about a minute
//! # as an MPI job of two processes, each step's batch shared by the ranks:
//! cargo build --release -p examples --features mpi --example language_model
//! mpirun -np 2 target/release/examples/language_model --quick --mpi
//! ```
//!
//! Outputs under `--out` (default `target/language_model`): `results.md`, `results.csv`,
//! `curves.png` (validation bits per character against steps, per arm), and `--json PATH`.
//!
//! `--profile DIR` first trains each arm a few steps on `Autodiff<Profiled<B>>` and writes
//! the profile of steps 4 to 6 (`--profile-skip`, `--profile-steps`) to `DIR/<arm>/`: the
//! operation table, the Chrome trace, `viewer.html`, the memory snapshot and the peak, with
//! scopes for the forward and backward passes, the optimizer and each block. A separate pass,
//! before the study's measurements, which it does not change.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::ElementConversion as _;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_compress::{AttentionKind, Converter, FeatureMap, LinearKind, Selection};
use burn_fused::optim::FusedAdamConfig;
use burn_memory::offload::{OffloadConfig, OffloadManager};
use burn_memory::{
    CountingAllocator, DeviceMemory, DeviceTransfer, MemoryTracker, MixedPrecisionConfig,
    Precision, Segments,
};
use burn_profiler::Profiled;
use burn_sketch::{SketchBackend, SketchInit};
use clap::Parser;
use examples::backend::{BackendKind, HalfCompute};
use examples::lm::profile::{ProfiledTraining, train_profiled};
use examples::lm::report::{Extra, Outputs, Run, write_outputs};
use examples::lm::{
    Batch, Corpus, FORTUNES_DIR, Positions, TransformerLm, TransformerLmConfig, batch, max_rel_diff,
};
use examples::parallel::MpiShare;
use examples::profile_args::ProfileArgs;
use examples::stats::median_seconds;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// mimalloc keeps freed blocks for the next step, where glibc hands large ones back to the OS
/// and page-faults them in again on every step (a `gelu` of 2 MB took 0.48 ms instead of
/// 0.03); the counting wrapper keeps the memory columns exact heap bytes.
#[global_allocator]
static ALLOCATOR: CountingAllocator<mimalloc::MiMalloc> =
    CountingAllocator::new(mimalloc::MiMalloc);

#[derive(Debug, Parser, Clone)]
#[command(about = "Sketched, low-rank and dense transformer language models, measured")]
struct Args {
    /// Backend (the study's tables were measured on Flex).
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    /// A UTF-8 text file to train on instead of the `fortunes` package.
    #[arg(long)]
    text: Option<PathBuf>,
    /// A one-minute run: one seed, few steps, the k = 16 arms only.
    #[arg(long)]
    quick: bool,
    /// Seeds (every arm trains once per seed).
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 2, 3])]
    seeds: Vec<u64>,
    /// Training steps per arm (the same token budget for all).
    #[arg(long, default_value_t = 250)]
    steps: usize,
    /// Fine-tuning steps after converting the trained dense model.
    #[arg(long, default_value_t = 150)]
    finetune_steps: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Context length.
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    d_model: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    /// Dropout in the arms' training (none by default: a run sees each character about once,
    /// far from overfitting, and without random draws in training the runs are the same
    /// whichever thread takes them).
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Dropout of the segment-checkpointing extra (whose point is reproducing the masks).
    #[arg(long, default_value_t = 0.1)]
    extras_dropout: f64,
    /// Training runs in parallel (the memory and speed measurements run alone); the machine's
    /// available parallelism by default. Each run trains its model on parameters of its own
    /// (`burn_memory::detach_params`: the fine-tuning runs start from one trained model, and
    /// two trainings sharing a parameter's autodiff node deadlock in Burn 0.21).
    #[arg(long, default_value_t = available_threads())]
    threads: usize,
    /// Data parallel across the processes of an MPI job (`mpirun -np N` on a build with
    /// `--features mpi`): each step of every run takes the ranks' slices of its batch and
    /// averages their gradients (the steps of one process on the whole batch), one run at a
    /// time. Rank 0 writes `--out`, rank R `--out/rank<R>`.
    #[arg(long, conflicts_with = "profile")]
    mpi: bool,
    /// Steps of each arm's memory and speed measurement (alone, before the training runs).
    #[arg(long, value_name = "N", default_value_t = 6)]
    measure_steps: usize,
    /// Profiling: --profile DIR (each arm's steps to DIR/<arm>/), --profile-skip,
    /// --profile-steps, --profile-sync.
    #[command(flatten)]
    profile: ProfileArgs,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Validation every this many steps (for the curves).
    #[arg(long, default_value_t = 50)]
    eval_every: usize,
    /// Validation batches (fixed windows, the same for every arm).
    #[arg(long, default_value_t = 16)]
    eval_batches: usize,
    /// Random features of the Performer arm.
    #[arg(long, default_value_t = 64)]
    performer_features: usize,
    /// Only the arms whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Skip the dense arm's extras (segment checkpointing, bf16, offloaded inference).
    #[arg(long)]
    no_extras: bool,
    /// Write every row as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Output directory.
    #[arg(long, default_value = "target/language_model")]
    out: PathBuf,
}

/// One arm of the study: which kind the blocks' linear layers are.
#[derive(Debug, Clone, Serialize)]
struct Arm {
    name: String,
    attention: AttentionKind,
    projections: LinearKind,
    mlp: LinearKind,
}

fn arms(args: &Args) -> Vec<Arm> {
    let ranks: &[usize] = if args.quick { &[16] } else { &[8, 16, 32] };
    let mut arms = vec![Arm {
        name: "dense".into(),
        attention: AttentionKind::Softmax,
        projections: LinearKind::Dense,
        mlp: LinearKind::Dense,
    }];
    for &k in ranks {
        let kind = LinearKind::Sketched {
            num_terms: 1,
            low_rank: k,
        };
        arms.push(Arm {
            name: format!("sketched-k{k}"),
            attention: AttentionKind::Softmax,
            projections: kind,
            mlp: kind,
        });
    }
    for &r in ranks {
        let kind = LinearKind::LowRank { rank: r };
        arms.push(Arm {
            name: format!("lowrank-r{r}"),
            attention: AttentionKind::Softmax,
            projections: kind,
            mlp: kind,
        });
    }
    arms.push(Arm {
        name: format!("performer-m{}", args.performer_features),
        attention: AttentionKind::Performer {
            num_features: args.performer_features,
            feature_map: FeatureMap::Softmax,
        },
        projections: LinearKind::Dense,
        mlp: LinearKind::Dense,
    });
    arms
}

/// `--threads`'s default: the threads the machine can run at once (one if unknown).
fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    // Held until the study ends: dropping it finalises MPI.
    let mpi = examples::parallel::init_mpi(args.mpi)?;
    if let Some(mpi) = &mpi {
        // The ranks' collective operations must come in the same order everywhere: one
        // training run at a time.
        args.threads = 1;
        if mpi.rank() != 0 {
            args.out = args.out.join(format!("rank{}", mpi.rank()));
        }
    }
    if args.quick {
        args.seeds.truncate(1);
        args.steps = args.steps.min(40);
        args.finetune_steps = args.finetune_steps.min(10);
        args.eval_every = 20;
        args.eval_batches = 4;
    }
    let documents = match &args.text {
        Some(path) => Corpus::read_text(path)?,
        None => Corpus::read_fortunes(Path::new(FORTUNES_DIR))?,
    };
    let corpus = Corpus::split(&documents, 10, 4 * args.context)?;
    println!(
        "corpus: {} documents, {} train / {} validation characters",
        documents.len(),
        corpus.train.len(),
        corpus.valid.len()
    );
    examples::with_backend!(args.backend, |B| {
        if let Some(dir) = &args.profile.profile {
            profile_arms::<B>(&args, &corpus, dir)?;
        }
        study::<Autodiff<B>>(&args, &corpus)
    })
}

/// The arms `--filter` keeps.
fn selected_arms(args: &Args) -> Vec<Arm> {
    arms(args)
        .into_iter()
        .filter(|a| args.filter.as_deref().is_none_or(|f| a.name.contains(f)))
        .collect()
}

/// `--profile DIR`: each arm's first `--profile-skip` + `--profile-steps` training steps on
/// `Autodiff<Profiled<B>>`, the last `--profile-steps` recorded (shapes, memory after each
/// operation, and on CPU every allocation) and written to `DIR/<arm>/`.
fn profile_arms<B>(args: &Args, corpus: &Corpus, dir: &Path) -> anyhow::Result<()>
where
    B: SketchBackend + DeviceMemory,
{
    let device = B::Device::default();
    let training = ProfiledTraining {
        batch: args.batch,
        context: args.context,
        lr: args.lr,
        seed: 0,
        steps: args.profile.total_steps(),
    };
    for arm in selected_arms(args) {
        let profiler = args
            .profile
            .step_profiler::<B>(&dir.join(&arm.name), &device)?;
        B::seed(&device, 0);
        let model = lm_config(args, arm.attention, arm.projections, arm.mlp)
            .init::<Autodiff<Profiled<B>>>(&device);
        let written = train_profiled(model, corpus, &device, training, &profiler)?;
        println!(
            "profile of {}: {} (viewer.html, operations.txt, trace.json, peak.txt)",
            arm.name,
            written.display()
        );
    }
    Ok(())
}

fn study<B>(args: &Args, corpus: &Corpus) -> anyhow::Result<()>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory + HalfCompute,
    B::InnerBackend: SketchBackend + DeviceMemory + DeviceTransfer,
    B::Half: AutodiffBackend + SketchBackend + DeviceMemory,
    <B::Half as AutodiffBackend>::InnerBackend: SketchBackend,
{
    let device = B::Device::default();
    let arms = selected_arms(args);
    let converted = arms.iter().any(|a| a.name == "dense")
        && args
            .filter
            .as_deref()
            .is_none_or(|f| "converted".contains(f) || "dense".contains(f));
    let valid = validation_batches::<B::InnerBackend>(corpus, args, &device);

    // Memory and speed of each arm's training step, measured alone (one step at a time in the
    // process: the heap counter is process-wide), before the runs that share the cores.
    let mut profiles = Vec::new();
    for arm in &arms {
        let config = lm_config(args, arm.attention, arm.projections, arm.mlp);
        B::seed(&device, 0);
        profiles.push(profile_arm(config.init::<B>(&device), corpus, args)?);
    }

    let total_steps = args.seeds.len()
        * (arms.len() * args.steps
            + if converted {
                3 * args.finetune_steps
            } else {
                0
            });
    let bar = ProgressBar::new(total_steps as u64).with_style(
        ProgressStyle::with_template("{elapsed_precise} {bar:30} {pos}/{len} steps {msg}")
            .expect("a valid template"),
    );
    // Every model is drawn here, seeded, in a fixed order; training draws nothing more (no
    // dropout in the arms), so the runs are the same whichever thread takes them.
    let mut jobs = Vec::new();
    for &seed in &args.seeds {
        for (index, arm) in arms.iter().enumerate() {
            let config = lm_config(args, arm.attention, arm.projections, arm.mlp);
            B::seed(&device, seed);
            jobs.push(Job {
                name: arm.name.clone(),
                profile: index,
                seed,
                steps: args.steps,
                start: None,
                model: config.init::<B>(&device),
            });
        }
    }
    let mut runs = Vec::new();
    let mut dense_models = Vec::new();
    for (model, run) in run_jobs(jobs, &profiles, corpus, args, &bar)? {
        if run.arm == "dense" {
            dense_models.push((run.seed, model));
        }
        runs.push(run);
    }
    if converted {
        let sketched = LinearKind::Sketched {
            num_terms: 1,
            low_rank: 16,
        };
        let mut jobs = Vec::new();
        for (name, kind, init, like) in conversions(sketched) {
            for (seed, dense) in &dense_models {
                B::seed(&device, *seed);
                let (model, report) = Converter::new()
                    .sketch_init(init)
                    .rule(Selection::types(["AnyMultiHeadAttention", "Mlp"]), kind)
                    .apply(dense.clone())?;
                tracing::info!("{name}:\n{report}");
                let start = valid_bpc(&model.valid(), &valid);
                let mut as_is = Run::new(&model, name, *seed);
                as_is.valid_bpc = start;
                as_is.curve = vec![(0, start)];
                runs.push(as_is);
                let profile = arms.iter().position(|a| a.name == like).unwrap_or(0);
                jobs.push(Job {
                    name: format!("{name}-ft"),
                    profile,
                    seed: *seed,
                    steps: args.finetune_steps,
                    start: Some(start),
                    model,
                });
            }
        }
        for (_, run) in run_jobs(jobs, &profiles, corpus, args, &bar)? {
            runs.push(run);
        }
    }
    bar.finish_and_clear();
    let mut extras = Vec::new();
    if !args.no_extras
        && let Some((seed, dense)) = dense_models.first()
    {
        extras.extend(segment_checkpointing::<B>(corpus, args, *seed)?);
        let f32_profile = profiles[arms.iter().position(|a| a.name == "dense").unwrap_or(0)];
        extras.extend(mixed_precision::<B::Half>(corpus, args, *seed, f32_profile));
        extras.extend(offloaded_inference(&dense.valid(), corpus, args)?);
    }
    let described = format!("{args:?}");
    let outputs = Outputs {
        dir: &args.out,
        json: args.json.as_deref(),
        args: &described,
    };
    write_outputs(outputs, &runs, &extras)
}

/// The trained dense model's conversions (name, kind, sketch initialisation, the arm whose
/// step profile it shares): Panther's unbiased sketch, the sketch fitted to the dense weights
/// by least squares, and the randomized SVD's low-rank layers of the same trainable size.
fn conversions(sketched: LinearKind) -> [(&'static str, LinearKind, SketchInit, &'static str); 3] {
    [
        (
            "converted-k16",
            sketched,
            SketchInit::Unbiased,
            "sketched-k16",
        ),
        (
            "converted-k16-fitted",
            sketched,
            SketchInit::Fitted,
            "sketched-k16",
        ),
        (
            "converted-r16",
            LinearKind::LowRank { rank: 16 },
            SketchInit::Unbiased,
            "lowrank-r16",
        ),
    ]
}

/// One training run for a worker thread.
struct Job<B: AutodiffBackend> {
    name: String,
    /// Which arm's [`Profile`] its memory and speed figures come from.
    profile: usize,
    seed: u64,
    steps: usize,
    /// Validation bits per character before training (fine-tuning runs start from one).
    start: Option<f64>,
    model: TransformerLm<B>,
}

/// What an arm's training step costs, measured with nothing else running.
#[derive(Debug, Clone, Copy)]
struct Profile {
    held_bytes: u64,
    step_peak_bytes: u64,
    tokens_per_second: f64,
}

/// `jobs` on `--threads` worker threads (each takes the next job when done with one); the
/// results in the jobs' order.
fn run_jobs<B>(
    jobs: Vec<Job<B>>,
    profiles: &[Profile],
    corpus: &Corpus,
    args: &Args,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<(TransformerLm<B>, Run)>>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
    B::InnerBackend: SketchBackend + DeviceTransfer,
{
    let count = jobs.len();
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads.max(1))
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    let device = B::Device::default();
                    let valid = validation_batches::<B::InnerBackend>(corpus, args, &device);
                    loop {
                        let next = {
                            let mut queue = queue.lock().expect("no worker panicked");
                            if queue.is_empty() {
                                None
                            } else {
                                Some(queue.remove(0))
                            }
                        };
                        let Some((order, job)) = next else {
                            return Ok(());
                        };
                        let Job {
                            name,
                            profile,
                            seed,
                            steps,
                            start,
                            model,
                        } = job;
                        // The fine-tuning runs' models share the trained model's unconverted
                        // parameters: on nodes of their own, the runs' graphs never merge.
                        let model = burn_memory::detach_params(model);
                        let (model, mut run) =
                            train(model, &name, seed, steps, corpus, &valid, args, bar)?;
                        let profile = profiles[profile];
                        run.held_bytes = profile.held_bytes;
                        run.step_peak_bytes = profile.step_peak_bytes;
                        run.tokens_per_second = profile.tokens_per_second;
                        if let Some(start) = start {
                            run.curve.insert(0, (0, start));
                        }
                        results
                            .lock()
                            .expect("no worker panicked")
                            .push((order, model, run));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a worker panicked"))
    })?;
    let mut results = results.into_inner().expect("no worker panicked");
    results.sort_by_key(|r| r.0);
    assert_eq!(results.len(), count, "every job ran");
    Ok(results.into_iter().map(|(_, m, r)| (m, r)).collect())
}

/// The memory and speed of `model`'s training step: `--measure-steps` steps alone, the heap
/// measured over the second (the optimizer's state exists by then), the speed over all but
/// the first.
fn profile_arm<B>(
    mut model: TransformerLm<B>,
    corpus: &Corpus,
    args: &Args,
) -> anyhow::Result<Profile>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
    B::InnerBackend: SketchBackend,
{
    let device = B::Device::default();
    let mut optim = FusedAdamConfig::new().init::<B, TransformerLm<B>>();
    let mut positions = Positions::new(0);
    let tracker = MemoryTracker::<B>::new(&device);
    let mut profile = Profile {
        held_bytes: 0,
        step_peak_bytes: 0,
        tokens_per_second: f64::NAN,
    };
    let mut timed = Duration::ZERO;
    let steps = args.measure_steps.max(3);
    for step in 0..steps {
        let starts = positions.starts(args.batch, corpus.train.len(), args.context);
        let data = batch::<B>(&corpus.train, &starts, args.context, &device);
        let start = Instant::now();
        let mut one = |model: TransformerLm<B>| {
            let grads = GradientsParams::from_grads(model.forward_loss(&data).backward(), &model);
            let model = Optimizer::step(&mut optim, args.lr, model, grads);
            B::sync(&device).expect("the device syncs");
            model
        };
        model = if step == 1 {
            let (model, report) = tracker.profile(|| one(model))?;
            profile.step_peak_bytes = report.peak_increase();
            profile.held_bytes = report.before.in_use;
            model
        } else {
            one(model)
        };
        if step > 0 {
            timed += start.elapsed();
        }
    }
    profile.tokens_per_second =
        ((steps - 1) * args.batch * args.context) as f64 / timed.as_secs_f64();
    Ok(profile)
}

fn lm_config(
    args: &Args,
    attention: AttentionKind,
    projections: LinearKind,
    mlp: LinearKind,
) -> TransformerLmConfig {
    TransformerLmConfig::new()
        .with_context(args.context)
        .with_d_model(args.d_model)
        .with_d_ff(4 * args.d_model)
        .with_n_blocks(args.blocks)
        .with_dropout(args.dropout)
        .with_attention(attention)
        .with_projections(projections)
        .with_mlp(mlp)
}

fn validation_batches<B: Backend>(
    corpus: &Corpus,
    args: &Args,
    device: &B::Device,
) -> Vec<Batch<B>> {
    let mut positions = Positions::new(0xDA7A);
    (0..args.eval_batches)
        .map(|_| {
            let starts = positions.starts(args.batch, corpus.valid.len(), args.context);
            batch(&corpus.valid, &starts, args.context, device)
        })
        .collect()
}

fn valid_bpc<B: SketchBackend>(model: &TransformerLm<B>, valid: &[Batch<B>]) -> f64 {
    let total: f64 = valid
        .iter()
        .map(|b| model.forward_loss(b).into_scalar().elem::<f64>())
        .sum();
    total / valid.len() as f64 / std::f64::consts::LN_2
}

/// How long a rank of an MPI job waits for the others in one step.
const MPI_TIMEOUT: Duration = Duration::from_secs(600);

#[allow(clippy::too_many_arguments)]
fn train<B>(
    mut model: TransformerLm<B>,
    arm: &str,
    seed: u64,
    steps: usize,
    corpus: &Corpus,
    valid: &[Batch<B::InnerBackend>],
    args: &Args,
    bar: &ProgressBar,
) -> anyhow::Result<(TransformerLm<B>, Run)>
where
    B: AutodiffBackend + SketchBackend,
    B::InnerBackend: SketchBackend + DeviceTransfer,
{
    let device = B::Device::default();
    let mut run = Run::new(&model, arm, seed);
    let mut optim = FusedAdamConfig::new().init::<B, TransformerLm<B>>();
    let mut positions = Positions::new(seed);
    // Under `--mpi`, this rank's share of the job.
    let share = args
        .mpi
        .then(|| MpiShare::<B::InnerBackend>::join(&model, &device, MPI_TIMEOUT))
        .transpose()?;
    let started = Instant::now();
    for step in 0..steps {
        let mut starts = positions.starts(args.batch, corpus.train.len(), args.context);
        if let Some(share) = &share {
            starts = share.shard(&starts)?;
        }
        let data = batch::<B>(&corpus.train, &starts, args.context, &device);
        let mut grads = GradientsParams::from_grads(model.forward_loss(&data).backward(), &model);
        if let Some(share) = &share {
            grads = share.mean_gradients(&model, grads)?;
        }
        model = optim.step(args.lr, model, grads);
        bar.inc(1);
        if (step + 1) % args.eval_every == 0 && step + 1 < steps {
            run.curve.push((step + 1, valid_bpc(&model.valid(), valid)));
        }
    }
    run.valid_bpc = valid_bpc(&model.valid(), valid);
    run.curve.push((steps, run.valid_bpc));
    run.train_seconds = started.elapsed().as_secs_f64();
    Ok((model, run))
}

/// Segment checkpointing on the trained dense model with dropout on: one segment per block,
/// against a plain backward that draws the same dropout masks.
fn segment_checkpointing<B>(corpus: &Corpus, args: &Args, seed: u64) -> anyhow::Result<Vec<Extra>>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
{
    let device = B::Device::default();
    B::seed(&device, seed);
    let model = lm_config(
        args,
        AttentionKind::Softmax,
        LinearKind::Dense,
        LinearKind::Dense,
    )
    .with_dropout(args.extras_dropout)
    .init::<B>(&device);
    let model = &model;
    let starts = Positions::new(seed + 1000).starts(args.batch, corpus.train.len(), args.context);
    let data = batch::<B>(&corpus.train, &starts, args.context, &device);
    let tracker = MemoryTracker::<B>::new(&device);
    let segments = Segments::Count(model.blocks.len());
    let repeats = if args.quick { 2 } else { 5 };
    let plain = |s: u64| {
        B::seed(&device, s);
        let grads = model
            .replayed_grads(&data, &segments)
            .expect("the segments fit the model");
        B::sync(&device).expect("the device syncs");
        grads
    };
    let segmented = |s: u64| {
        B::seed(&device, s);
        let grads = model
            .segmented_grads(&data, &segments)
            .expect("the segments fit the model");
        B::sync(&device).expect("the device syncs");
        grads
    };
    let (reference, plain_report) = tracker.profile(|| plain(seed))?;
    let (checked, seg_report) = tracker.profile(|| segmented(seed))?;
    let diff = max_rel_diff(model, &reference, &checked);
    // Seeds `seed + 1`, `seed + 2`...: other masks each time.
    let time = |f: &dyn Fn(u64) -> GradientsParams| {
        let mut s = seed;
        median_seconds(0, repeats, || {
            s += 1;
            let _ = f(s);
        })
    };
    let (plain_s, seg_s) = (time(&plain), time(&segmented));
    Ok(vec![Extra {
        what: format!(
            "segment checkpointing, {} segments, dropout {}",
            model.blocks.len(),
            args.extras_dropout
        ),
        peak_bytes: seg_report.peak_increase(),
        seconds: seg_s,
        baseline_peak_bytes: plain_report.peak_increase(),
        baseline_seconds: plain_s,
        max_rel_diff: diff,
        note: "gradients against a plain backward with the same dropout masks".into(),
    }])
}

/// bf16 mixed precision: the dense arm's training, f32 master weights, bf16 compute, on the
/// study's backend's [`HalfCompute`] backend (`FastFlex` for Flex).
fn mixed_precision<B>(corpus: &Corpus, args: &Args, seed: u64, f32_profile: Profile) -> Vec<Extra>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
    B::InnerBackend: SketchBackend,
{
    let device = B::Device::default();
    let valid = validation_batches::<B::InnerBackend>(corpus, args, &device);
    let Ok(mut amp) = MixedPrecisionConfig::new()
        .with_compute(Precision::Bf16)
        .init::<B>(&device)
    else {
        return vec![Extra {
            what: "bf16 mixed precision".into(),
            peak_bytes: 0,
            seconds: f64::NAN,
            baseline_peak_bytes: 0,
            baseline_seconds: f64::NAN,
            max_rel_diff: f64::NAN,
            note: "this backend has no bf16".into(),
        }];
    };
    B::seed(&device, seed);
    let mut model = lm_config(
        args,
        AttentionKind::Softmax,
        LinearKind::Dense,
        LinearKind::Dense,
    )
    .init::<B>(&device);
    let mut optim = FusedAdamConfig::new().init::<B, TransformerLm<B>>();
    let mut positions = Positions::new(seed);
    let tracker = MemoryTracker::<B>::new(&device);
    let (mut peak, mut elapsed) = (0, Duration::ZERO);
    let steps = args.steps.min(50);
    for step in 0..steps {
        let starts = positions.starts(args.batch, corpus.train.len(), args.context);
        let data = batch::<B>(&corpus.train, &starts, args.context, &device);
        let start = Instant::now();
        let mut one = |model: TransformerLm<B>, amp: &mut burn_memory::MixedPrecision| {
            let cast = amp.cast_module(&model);
            let loss = amp.scale_loss(cast.forward_loss(&data));
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let (model, _) = amp.step(&mut optim, args.lr, model, grads);
            B::sync(&device).expect("the device syncs");
            model
        };
        model = if step == 1 {
            let (model, report) = tracker.profile(|| one(model, &mut amp)).expect("profiled");
            peak = report.peak_increase();
            model
        } else {
            one(model, &mut amp)
        };
        elapsed += start.elapsed();
    }
    let bpc = valid_bpc(&model.valid(), &valid);
    vec![Extra {
        what: format!(
            "bf16 mixed precision, dense, {steps} steps, on {}",
            B::name(&device)
        ),
        peak_bytes: peak,
        seconds: elapsed.as_secs_f64() / steps as f64,
        baseline_peak_bytes: f32_profile.step_peak_bytes,
        baseline_seconds: (args.batch * args.context) as f64 / f32_profile.tokens_per_second,
        max_rel_diff: f64::NAN,
        note: format!(
            "validation {bpc:.4} bits/char after {steps} steps; {} steps skipped; baseline: the f32 dense profile",
            amp.skipped_steps()
        ),
    }]
}

/// Inference with the blocks streamed one at a time from the disk tier, against the resident
/// model.
fn offloaded_inference<B>(
    model: &TransformerLm<B>,
    corpus: &Corpus,
    args: &Args,
) -> anyhow::Result<Vec<Extra>>
where
    B: SketchBackend + DeviceMemory,
{
    let device = model.head.to_dense_weight().device();
    let starts = Positions::new(77).starts(args.batch, corpus.valid.len(), args.context);
    let data = batch::<B>(&corpus.valid, &starts, args.context, &device);
    let tracker = MemoryTracker::<B>::new(&device);
    let resident = |m: &TransformerLm<B>| {
        let h = m
            .blocks
            .iter()
            .fold(m.embed(data.inputs.clone()), |h, b| b.forward(h, None));
        let logits = m.head.forward(m.norm.forward(h));
        B::sync(&device).expect("the device syncs");
        logits
    };
    let start = Instant::now();
    let (expected, base) = tracker.profile(|| resident(model))?;
    let base_s = start.elapsed().as_secs_f64();
    let blocks = model.blocks.clone();
    let manager = OffloadManager::<B>::new(
        OffloadConfig::new()
            .with_host_tier(false)
            .with_prefetch(false)
            .with_device_budget_bytes(Some(1 << 30)),
        &device,
    )?;
    let offloaded = manager
        .wrap(
            TransformerLm {
                blocks,
                ..model.clone()
            },
            &burn_memory::offload::OffloadSelection::default(),
        )
        .map_err(|e| e.error)?;
    let start = Instant::now();
    let (logits, report) = tracker.profile(|| -> anyhow::Result<_> {
        let embedded = offloaded.run(|m| m.embed(data.inputs.clone()))?;
        let hidden = offloaded.forward_layers(embedded)?;
        let logits = offloaded.run(|m| m.head.forward(m.norm.forward(hidden)))?;
        B::sync(&device).expect("the device syncs");
        Ok(logits)
    })?;
    let logits = logits?;
    let seconds = start.elapsed().as_secs_f64();
    let scale = expected.clone().abs().max().into_scalar().elem::<f64>();
    let diff = (expected - logits).abs().max().into_scalar().elem::<f64>() / scale;
    let summary = manager.summary();
    manager.cleanup();
    Ok(vec![Extra {
        what: "offloaded inference (disk tier, one block on the device at a time)".into(),
        peak_bytes: report.peak_increase(),
        seconds,
        baseline_peak_bytes: base.peak_increase(),
        baseline_seconds: base_s,
        max_rel_diff: diff,
        note: format!("{summary}")
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
    }])
}
