//! Trains an MLP classifier on MNIST with sketched (`SkLinear`) hidden layers, or with dense
//! ones for comparison (`--dense`), on burn-train's dashboard; then reports test accuracy,
//! parameter counts and wall time.
//!
//! ```text
//! cargo run --release -p examples --example train_mnist              # sketched, CPU
//! cargo run --release -p examples --example train_mnist -- --dense   # the dense baseline
//! cargo run --release -p examples --example train_mnist -- --epochs 12 --resume
//! cargo run --release -p examples --example train_mnist -- --auto-batch 400 --checkpointing
//! cargo run --release -p examples --example train_mnist -- --checkpoint-segments 2
//! cargo run --release -p examples --example train_mnist -- --backend wgpu --amp f16
//! cargo run --release -p examples --features cuda --example train_mnist -- --backend cuda
//! cargo run --release -p examples --example train_mnist -- --epochs 1 --profile target/profile
//! cargo run --release -p examples --features data-parallel --example train_mnist -- --devices 2
//! # two MPI processes (one machine here; a host file or Slurm's `srun` for several):
//! cargo build --release -p examples --features mpi --example train_mnist
//! mpirun -np 2 --enable-recovery target/release/examples/train_mnist --mpi
//! ```
//!
//! The data is the 10,000-digit sample embedded in `examples/data/mnist10k` (8,000 train,
//! 2,000 test); `--data DIR` reads a full MNIST in the same IDX format. Logs and a checkpoint
//! per epoch go to `--dir` (default `target/train_mnist/<sketched|dense>`); `--resume`
//! continues from its newest complete checkpoint. `--profile DIR` trains on
//! `Autodiff<Profiled<B>>` and records steps 4 to 6 (`--profile-skip`, `--profile-steps`)
//! inside the learner: the operation table, a Chrome trace and where memory peaked.
//! `--devices N` trains N data-parallel peers; `--mpi` makes this process one rank of an MPI
//! job, every rank running `--devices` peers (burn-data-parallel's `DataParallel`). Rank 0
//! validates, writes the checkpoints and prints the report; the other ranks log to
//! `DIR/rank<R>`.

use std::path::PathBuf;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn_memory::Precision;

use burn_profiler::Profiled;
use clap::{Parser, ValueEnum};
use examples::backend::{BackendKind, HalfCompute};
use examples::mlp::MlpConfig;
use examples::mnist::Mnist;
use examples::profile_args::ProfileArgs;
use examples::training::{TrainingConfig, describe, train, train_profiled};

/// On NdArray every operation allocates its output. mimalloc keeps freed blocks for the next
/// step where glibc hands large ones back to the OS and page-faults them in again. The counting
/// wrapper makes the dashboard's memory metrics exact heap bytes rather than resident memory.
#[global_allocator]
static ALLOCATOR: burn_memory::CountingAllocator<mimalloc::MiMalloc> =
    burn_memory::CountingAllocator::new(mimalloc::MiMalloc);

#[derive(Debug, Parser)]
#[command(about = "Train an MNIST MLP with sketched hidden layers")]
struct Args {
    /// Backend to train on.
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    /// Passes over the training set (in total, when resuming).
    #[arg(long, default_value_t = 8)]
    epochs: usize,
    /// Digits per optimisation step.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Hidden layer widths.
    #[arg(long, value_delimiter = ',', default_value = "512,256")]
    hidden: Vec<usize>,
    /// Sketched layers: number of terms T.
    #[arg(long, default_value_t = 1)]
    num_terms: usize,
    /// Sketched layers: rank k of each term.
    #[arg(long, default_value_t = 32)]
    low_rank: usize,
    /// Train the same MLP with dense `nn::Linear` hidden layers instead.
    #[arg(long)]
    dense: bool,
    /// Directory with MNIST IDX files (`train-*`, `t10k-*`), default the embedded sample.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Use only the first N training digits (quick runs).
    #[arg(long)]
    train_limit: Option<usize>,
    /// Seed of the initialisation and the shuffling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Run directory: logs, checkpoints, the configuration.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Continue from the newest checkpoint in the run directory.
    #[arg(long)]
    resume: bool,
    /// Gradient checkpointing: recompute memory-bound activations in backward.
    #[arg(long, conflicts_with = "profile")]
    checkpointing: bool,
    /// After training, quantize every layer to int8 (burn-compress's `Int8Linear`) and report
    /// its test accuracy, bytes and inference time against the f32 model's.
    #[arg(long)]
    int8: bool,
    /// Segment checkpointing: split the layers (hidden layers and the output layer) into N
    /// segments, keep only their inputs in the forward pass, recompute each in backward.
    #[arg(long, value_name = "N")]
    checkpoint_segments: Option<usize>,
    /// Pick the batch size: the largest whose training step peaks within this many MB.
    #[arg(long, value_name = "MB")]
    auto_batch: Option<u64>,
    /// Mixed precision: forward and backward in f16 (dynamic loss scaling) or bf16, over f32
    /// weights. Needs a backend with that type (Flex, wgpu; NdArray has only f32/f64).
    #[arg(long, value_enum)]
    amp: Option<AmpKind>,
    /// Profiling: --profile DIR (inside the learner), --profile-skip, --profile-steps,
    /// --profile-sync.
    #[command(flatten)]
    profile: ProfileArgs,
    /// Data-parallel training on N peers on this machine (threads on the device, on
    /// burn-collective): each takes batch-size/N digits of every step, and the gradients are
    /// averaged before each optimizer step.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        conflicts_with = "profile"
    )]
    devices: usize,
    /// Data parallel across the processes of an MPI job: launch the built binary with
    /// `mpirun -np N` (or `srun`); each process runs `--devices` peers, rank 0 validates and
    /// writes the checkpoints. Needs a build with `--features mpi`.
    #[arg(long, conflicts_with = "profile")]
    mpi: bool,
    /// Data parallel on a CPU backend: threads of each peer's own compute pool (default: the
    /// peers share the process's threads).
    #[arg(long, value_name = "N")]
    threads_per_peer: Option<usize>,
    /// Data parallel: seconds a collective operation waits for the other peers before the run
    /// fails (a peer died or never arrived).
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    collective_timeout: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AmpKind {
    F16,
    Bf16,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Held until the run ends: dropping it finalises MPI.
    let mpi = examples::parallel::init_mpi(args.mpi)?;
    let rank = mpi.as_ref().map_or(0, |mpi| mpi.rank());
    let model = MlpConfig::new()
        .with_hidden(args.hidden.clone())
        .with_num_terms(args.num_terms)
        .with_low_rank(args.low_rank)
        .with_dense(args.dense);
    let config = TrainingConfig::new(model)
        .with_epochs(args.epochs)
        .with_batch_size(args.batch_size)
        .with_learning_rate(args.lr)
        .with_seed(args.seed)
        .with_train_limit(args.train_limit)
        .with_auto_batch_mb(args.auto_batch)
        .with_checkpoint_segments(args.checkpoint_segments)
        .with_amp(args.amp.map(|kind| match kind {
            AmpKind::F16 => Precision::F16,
            AmpKind::Bf16 => Precision::Bf16,
        }))
        .with_devices(args.devices)
        .with_collective_timeout_secs(args.collective_timeout)
        .with_threads_per_peer(args.threads_per_peer)
        .with_int8(args.int8)
        .with_mpi(args.mpi);
    let data = args.data.clone().unwrap_or_else(Mnist::embedded_dir);
    let kind = if args.dense { "dense" } else { "sketched" };
    let main_dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/train_mnist").join(kind));
    // Ranks must not share their logs; on resuming, all take rank 0's checkpoints.
    let dir = examples::parallel::rank_dir(&main_dir, rank);
    if args.resume {
        examples::parallel::share_checkpoints(&main_dir, rank)?;
    }

    let report = examples::with_backend!(args.backend, |B| {
        let device: burn::tensor::Device<B> = Default::default();
        if let Some(profile_dir) = &args.profile.profile {
            let profiler = args.profile.step_profiler::<B>(profile_dir, &device)?;
            train_profiled::<Autodiff<Profiled<B>>>(
                &config,
                &data,
                &dir,
                args.resume,
                &device,
                profiler,
            )?
        } else if args.checkpointing {
            type Balanced = Autodiff<B, BalancedCheckpointing>;
            train::<Balanced>(&config, &data, &dir, args.resume, &device)?
        } else if args.amp.is_some() {
            // Half-precision compute on Flex takes `FastFlex` (Flex computes `bf16`/`f16` one
            // value at a time); every other backend is its own.
            type Half = <B as HalfCompute>::Half;
            train::<Autodiff<Half>>(&config, &data, &dir, args.resume, &device)?
        } else {
            train::<Autodiff<B>>(&config, &data, &dir, args.resume, &device)?
        }
    });
    if rank != 0 {
        // Rank 0 reports the run (its model is every rank's).
        return Ok(());
    }
    println!("model:                    {}", describe(&config.model));
    println!(
        "test accuracy:            {:.2}%",
        100.0 * report.test_accuracy
    );
    println!(
        "hidden trainable params:  {}",
        report.hidden_trainable_params
    );
    println!("total trainable params:   {}", report.trainable_params);
    println!("batch size:               {}", report.batch_size);
    if let Some(amp) = &report.amp {
        println!(
            "mixed precision:          {:?}, loss scale {} at the end, {} steps skipped",
            amp.precision(),
            amp.scale(),
            amp.skipped_steps()
        );
    }
    println!(
        "training time:            {:.1}s (epochs {}..={})",
        report.seconds,
        report.resumed_from + 1,
        args.epochs
    );
    println!("run directory:            {}", dir.display());
    if let Some(int8) = &report.int8 {
        println!(
            "int8 (quantized):         {:.2}% test accuracy, {} → {} bytes, test set in {:.1} ms \
             against {:.1} ms in f32 ({:.2}×)",
            100.0 * int8.test_accuracy,
            int8.bytes.0,
            int8.bytes.1,
            int8.int8_ms,
            int8.f32_ms,
            int8.f32_ms / int8.int8_ms
        );
    }
    if let Some(parallel) = &report.parallel {
        println!("data parallel:            {parallel}");
    }
    if let Some(profile_dir) = &report.profile_dir {
        println!(
            "profile:                  {} (viewer.html, operations.txt, trace.json, peak.txt)",
            profile_dir.display()
        );
    }
    Ok(())
}
