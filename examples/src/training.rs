//! The MNIST training run behind the `train_mnist` example, driven by burn-train: its
//! `SupervisedTraining` loop, metrics (loss, accuracy, CPU memory and use) on the TUI dashboard
//! (one line per epoch when stdout is not a terminal), and a file checkpoint each epoch that
//! `resume` continues from (the model, the optimizer and the mixed-precision state).
//!
//! Beside it, [`train_plain`]: a plain Adam loop for any classifier of the digits, which the
//! studies that train several models alike (`conv_mnist`, `prune_mnist`) share.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::config::Config;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::DefaultRecorder;
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use burn::train::metric::{AccuracyMetric, CpuUse, LossMetric};
use burn::train::{Learner, SupervisedTraining, TrainStep};
use burn_memory::{
    BatchSizeSearchConfig, DeviceMemory, DeviceMemoryMetric, DeviceTransfer, LossScale,
    MemoryBudget, MixedPrecision, MixedPrecisionConfig, Precision, Segments,
};
use burn_profiler::StepProfiler;
use burn_sketch::SketchBackend;

use crate::parallel::{DataParallel, DataParallelReport, DistributedError};

use crate::checkpoint::AtomicFileRecorder;
pub use crate::checkpoint::{checkpoint_path, latest_checkpoint};
use crate::data::{DigitBatch, DigitBatcher, DigitDataset};
use crate::mlp::{Mlp, MlpConfig};
use crate::mnist::{IdxError, Mnist};
use crate::progress::EpochLines;

/// What a training run is asked to do.
#[derive(Config, Debug)]
pub struct TrainingConfig {
    /// The model.
    pub model: MlpConfig,
    /// Passes over the training set.
    #[config(default = 8)]
    pub epochs: usize,
    /// Digits per optimisation step.
    #[config(default = 64)]
    pub batch_size: usize,
    /// Adam learning rate.
    #[config(default = 1e-3)]
    pub learning_rate: f64,
    /// Seed of the initialisation and the shuffling.
    #[config(default = 42)]
    pub seed: u64,
    /// Use only the first N training digits (quick runs).
    #[config(default = "None")]
    pub train_limit: Option<usize>,
    /// Data-loading threads. With one, batches arrive in the shuffled order, so a seed fixes
    /// the run (on NdArray up to the order of its threads' partial sums, about 1e-7 of the
    /// loss); with more, their batches interleave as the threads finish them.
    #[config(default = 1)]
    pub workers: usize,
    /// Instead of `batch_size`, use the largest batch (a multiple of 16) whose training step
    /// peaks within this many MB (burn-memory's batch-size search, run before training).
    #[config(default = "None")]
    pub auto_batch_mb: Option<u64>,
    /// Mixed-precision training in this compute type (burn-memory's AMP): f16 with a dynamic
    /// loss scale, bf16 unscaled (it has f32's range). The backend must support the type.
    #[config(default = "None")]
    pub amp: Option<Precision>,
    /// Segment checkpointing of each training step in this many segments (burn-memory's
    /// `segmented_backward`): only their inputs are kept, each is recomputed in backward.
    #[config(default = "None")]
    pub checkpoint_segments: Option<usize>,
    /// Data-parallel peers in this process (burn-data-parallel's `DataParallel`): each trains
    /// a replica on its shard of the data, with `batch_size / peers` digits per step, and the
    /// gradients are averaged over all peers of the run. 1, without `mpi`, trains on one
    /// device without it.
    #[config(default = 1)]
    pub devices: usize,
    /// This process is one rank of an MPI job (`mpirun -np N`, `srun`): every process runs
    /// `devices` peers, and the processes' gradients meet in MPI's all-reduce. The caller
    /// holds MPI initialised ([`crate::parallel::init_mpi`]).
    #[config(default = false)]
    pub mpi: bool,
    /// How long a collective operation may wait for the other peers, in seconds.
    #[config(default = 600)]
    pub collective_timeout_secs: u64,
    /// Data parallel on a CPU backend: threads of each peer's own pool (`None`: the peers share
    /// the process's pool).
    #[config(default = "None")]
    pub threads_per_peer: Option<usize>,
    /// After training, quantize the model to `int8` ([`Mlp::to_int8`]) and report its test
    /// accuracy, size and inference time next to the `f32` model's.
    #[config(default = false)]
    pub int8: bool,
}

impl TrainingConfig {
    /// Whether the run asks for data parallel: several local peers, or several processes.
    pub fn asks_data_parallel(&self) -> bool {
        self.devices > 1 || self.mpi
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum TrainingError {
    /// The data could not be read.
    #[error(transparent)]
    Data(#[from] IdxError),
    /// The batch-size search failed.
    #[error(transparent)]
    Memory(#[from] burn_memory::MemoryError),
    /// The profiler could not start or write its files.
    #[error(transparent)]
    Profile(#[from] burn_profiler::ProfileError),
    /// Data-parallel training failed (a peer died or never arrived, replicas differ...).
    #[error(transparent)]
    Distributed(#[from] DistributedError),
    /// The run asks for a part this build left out.
    #[error(transparent)]
    NotCompiled(#[from] crate::backend::NotCompiled),
    /// The batch cannot be shared evenly by the peers.
    #[error("batch size {batch} cannot be split evenly over {peers} data-parallel peers")]
    UnevenBatch {
        /// The batch size.
        batch: usize,
        /// The peers of the run.
        peers: usize,
    },
    /// The run directory could not be prepared.
    #[error("cannot prepare the run directory {path}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `resume` was asked for a directory whose run had another configuration.
    #[error("cannot resume {path}: it holds a run of another configuration ({reason})")]
    ConfigMismatch {
        /// The directory.
        path: PathBuf,
        /// What differs, or why the saved configuration could not be read.
        reason: String,
    },
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainingReport {
    /// Accuracy of the final model on the test set, in `[0, 1]`.
    pub test_accuracy: f64,
    /// Mean cross-entropy of the final model on the training digits.
    pub train_loss: f64,
    /// Trainable parameters of the hidden layers.
    pub hidden_trainable_params: usize,
    /// Trainable parameters of the whole model.
    pub trainable_params: usize,
    /// The epoch this run started from (0 for a fresh run).
    pub resumed_from: usize,
    /// Wall time of the training loop, in seconds.
    pub seconds: f64,
    /// The batch size trained with (the search's result with `auto_batch_mb`).
    pub batch_size: usize,
    /// The mixed-precision state at the end (loss scale, skipped steps), with `amp`.
    pub amp: Option<MixedPrecision>,
    /// Where the profile of the profiled steps was written, with [`train_profiled`].
    pub profile_dir: Option<PathBuf>,
    /// What the peers did, for a data-parallel run.
    pub parallel: Option<DataParallelReport>,
    /// The `int8` model against the `f32` one, with `int8`.
    pub int8: Option<Int8Report>,
}

/// The trained model quantized to `int8` against itself in `f32`, on the test set.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Int8Report {
    /// Test accuracy of the `int8` model, in `[0, 1]`.
    pub test_accuracy: f64,
    /// Milliseconds for the whole test set's logits (batches of 500), median of 5: `f32`.
    pub f32_ms: f64,
    /// The same for the `int8` model.
    pub int8_ms: f64,
    /// Bytes of the model's tensors: `f32`, then `int8`.
    pub bytes: (usize, usize),
}

/// Quantizes `model` and measures both forms on `data`.
fn int8_report<B: SketchBackend>(
    model: &Mlp<B>,
    data: &DigitDataset,
    device: &B::Device,
) -> Int8Report {
    use burn::data::dataloader::batcher::Batcher;
    let quantized = model.to_int8();
    let (_, test_accuracy) = evaluate_logits(data, device, |x| quantized.forward(x));
    let indices: Vec<usize> = (0..data.len()).collect();
    let batches: Vec<Tensor<B, 2>> = indices
        .chunks(500)
        .map(|chunk| {
            let items = chunk.iter().filter_map(|&i| data.get(i)).collect();
            let batch: DigitBatch<B> = DigitBatcher.batch(items, device);
            batch.images
        })
        .collect();
    // One pass untimed, then the median of 5.
    let time = |forward: &dyn Fn(Tensor<B, 2>) -> Tensor<B, 2>| {
        1e3 * crate::stats::median_seconds(1, 5, || {
            for x in &batches {
                let _ = B::sync(device);
                drop(forward(x.clone()));
            }
            let _ = B::sync(device);
        })
    };
    let f32_ms = time(&|x| model.forward(x));
    let int8_ms = time(&|x| quantized.forward(x));
    let f32_bytes = burn_compress::stored_bytes::<B, _>(model);
    Int8Report {
        test_accuracy,
        f32_ms,
        int8_ms,
        bytes: (f32_bytes, quantized.stored_bytes()),
    }
}

/// Trains on the MNIST files in `data_dir`, writing logs and checkpoints to `dir`.
///
/// A fresh run (`resume == false`) clears the logs and checkpoints of an earlier run in `dir`.
/// With `resume`, it continues from the newest checkpoint in `dir` (the model, the optimizer
/// state and the epoch count), provided `dir` holds a run of the same configuration.
pub fn train<B>(
    config: &TrainingConfig,
    data_dir: &Path,
    dir: &Path,
    resume: bool,
    device: &B::Device,
) -> Result<TrainingReport, TrainingError>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
    B::InnerBackend: SketchBackend + DeviceTransfer,
{
    run::<B>(config, data_dir, dir, resume, device, None)
}

/// [`train`] with `profiler` marking each training step inside the learner: it records the
/// steps of its window (`B` is then `Autodiff<Profiled<_>>`) and writes the profile; the
/// report says where.
///
/// # Errors
/// As [`train`], and [`TrainingError::Memory`] when the profile could not be written.
pub fn train_profiled<B>(
    config: &TrainingConfig,
    data_dir: &Path,
    dir: &Path,
    resume: bool,
    device: &B::Device,
    profiler: StepProfiler,
) -> Result<TrainingReport, TrainingError>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
    B::InnerBackend: SketchBackend + DeviceTransfer,
{
    run::<B>(config, data_dir, dir, resume, device, Some(profiler))
}

fn run<B>(
    config: &TrainingConfig,
    data_dir: &Path,
    dir: &Path,
    resume: bool,
    device: &B::Device,
    profiler: Option<StepProfiler>,
) -> Result<TrainingReport, TrainingError>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
    B::InnerBackend: SketchBackend + DeviceTransfer,
{
    let mut train_set = Mnist::read(data_dir, "train")?;
    if let Some(limit) = config.train_limit {
        train_set = train_set.truncate(limit);
    }
    let test_set = Mnist::read(data_dir, "t10k")?;
    let resumed_from = prepare_dir(config, dir, resume)?;

    let amp = config
        .amp
        .map(|precision| {
            let loss_scale = match precision {
                Precision::F16 => LossScale::dynamic(),
                Precision::F32 | Precision::Bf16 => LossScale::Static(1.0),
            };
            MixedPrecisionConfig::new()
                .with_compute(precision)
                .with_loss_scale(loss_scale)
                .init::<B>(device)
        })
        .transpose()?;
    // Each call gives the model a loss-scale state of its own.
    let with_amp = |model: Mlp<B>| match &amp {
        Some(amp) => model.with_amp(amp.clone()),
        None => model,
    };
    B::seed(device, config.seed);
    let mut model = with_amp(config.model.init(device));
    if let Some(count) = config.checkpoint_segments {
        model = model.with_segments(Segments::Count(count))?;
    }
    if let Some(profiler) = &profiler {
        model = model.with_profiler(profiler.clone());
    }
    let train_data = DigitDataset::new(train_set);
    let batch_size = match config.auto_batch_mb {
        Some(mb) => {
            // On a copy, so that the search's steps leave the run's loss scale alone.
            let copy = with_amp(model.clone());
            search_batch_size(&copy, mb, train_data.len(), config.model.d_input, device)?
        }
        None => config.batch_size,
    };
    let test_data = DigitDataset::new(test_set);
    let parallel = data_parallel::<B>(config, device)?;
    // Data parallel: `batch_size` is the step's batch over all peers.
    let peer_batch = match &parallel {
        Some((_, peers)) if batch_size % peers != 0 => {
            return Err(TrainingError::UnevenBatch {
                batch: batch_size,
                peers: *peers,
            });
        }
        Some((_, peers)) => batch_size / peers,
        None => batch_size,
    };
    let loader_train = DataLoaderBuilder::new(DigitBatcher)
        .batch_size(peer_batch)
        .shuffle(config.seed)
        .num_workers(config.workers)
        .build(train_data.clone());
    let loader_test = DataLoaderBuilder::new(DigitBatcher)
        .batch_size(batch_size.max(500))
        .num_workers(config.workers)
        .build(test_data.clone());

    let mut training = SupervisedTraining::new(dir, loader_train, loader_test)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .metric_train_numeric(DeviceMemoryMetric::<B>::in_use(device))
        .metric_train_numeric(DeviceMemoryMetric::<B>::peak(device))
        .metric_train_numeric(CpuUse::new())
        .with_file_checkpointer(AtomicFileRecorder(DefaultRecorder::new()))
        .num_epochs(config.epochs)
        .summary();
    if resumed_from > 0 {
        training = training.checkpoint(resumed_from);
    }
    if let Some((parallel, _)) = &parallel {
        training = training.with_training_strategy(parallel.strategy());
    }
    // burn-train's dashboard on a terminal; elsewhere one line per epoch instead of its
    // fallback's debug structure per iteration. An MPI rank's output is a pseudo-terminal of
    // `mpirun`, which multiplexes every rank's: no dashboard there (it cannot open the
    // terminal, and would panic).
    if !std::io::stdout().is_terminal() || config.mpi {
        training = training.renderer(EpochLines::stdout());
    }
    tracing::info!(
        "training {} for {} epochs (from epoch {resumed_from}), run directory {}",
        describe(&config.model),
        config.epochs,
        dir.display()
    );
    let start = Instant::now();
    let result = training.launch(Learner::new(
        model,
        AdamConfig::new().init(),
        config.learning_rate,
    ));
    let seconds = start.elapsed().as_secs_f64();
    // The renderer prints its summary when dropped: let it do so before the report.
    drop(result.renderer);
    let model = result.model;
    let parallel = parallel
        .map(|(parallel, _)| parallel.report())
        .transpose()?;
    let profile_dir = profiler.map(|profiler| profiler.finish()).transpose()?;

    let (train_loss, _) = evaluate(&model, &train_data, device);
    let (_, test_accuracy) = evaluate(&model, &test_data, device);
    let int8 = config.int8.then(|| int8_report(&model, &test_data, device));
    Ok(TrainingReport {
        test_accuracy,
        train_loss,
        hidden_trainable_params: model.hidden_trainable_params(),
        trainable_params: model.trainable_params(),
        resumed_from,
        seconds,
        batch_size,
        amp: model.amp(),
        profile_dir,
        parallel,
        int8,
    })
}

/// The data-parallel run `config` asks for, with its number of peers over all processes;
/// `None` for one device.
#[cfg(feature = "data-parallel")]
fn data_parallel<B: AutodiffBackend>(
    config: &TrainingConfig,
    device: &B::Device,
) -> Result<Option<(DataParallel<B>, usize)>, TrainingError> {
    if !config.asks_data_parallel() {
        return Ok(None);
    }
    let devices = vec![device.clone(); config.devices.max(1)];
    let parallel_config = crate::parallel::DataParallelConfig::new()
        .with_timeout(std::time::Duration::from_secs(
            config.collective_timeout_secs,
        ))
        .with_mpi(config.mpi)
        .with_threads_per_peer(config.threads_per_peer);
    let parallel = DataParallel::new(devices, parallel_config)?;
    let peers = parallel.world_size();
    Ok(Some((parallel, peers)))
}

/// Without data parallel in this build: one device, or [`NotCompiled`](crate::parallel::NotCompiled).
#[cfg(not(feature = "data-parallel"))]
fn data_parallel<B: AutodiffBackend>(
    config: &TrainingConfig,
    _device: &B::Device,
) -> Result<Option<(DataParallel<B>, usize)>, TrainingError> {
    if !config.asks_data_parallel() {
        return Ok(None);
    }
    Err(TrainingError::NotCompiled(crate::parallel::NOT_COMPILED))
}

/// The largest batch size, a multiple of 16 up to the training set's size, whose full training
/// step peaks within `budget_mb` MB: the learner's own step (forward and backward, in the
/// compute type under AMP), then Adam's.
fn search_batch_size<B>(
    model: &Mlp<B>,
    budget_mb: u64,
    max: usize,
    inputs: usize,
    device: &B::Device,
) -> Result<usize, TrainingError>
where
    B: AutodiffBackend + SketchBackend + DeviceMemory,
    B::InnerBackend: SketchBackend,
{
    let search = BatchSizeSearchConfig::new(MemoryBudget::Bytes(budget_mb * 1_000_000))
        .with_start(16.min(max))
        .with_multiple_of(16)
        .with_max(max)
        .init::<B>(device)?;
    let result = search.run(|batch| {
        let mut optim = AdamConfig::new().init();
        let images = Tensor::random([batch, inputs], Distribution::Default, device);
        let targets = Tensor::<B, 1, Int>::zeros([batch], device);
        let output = TrainStep::step(model, DigitBatch { images, targets });
        let _ = optim.step(1e-3, model.clone(), output.grads);
        Ok(())
    })?;
    tracing::info!("batch-size search: {result}");
    println!("{result}");
    Ok(result.batch_size)
}

/// What [`train_plain`] runs: Adam (default settings) at `learning_rate`, for `epochs` passes
/// over the data in shuffled batches of `batch_size`, epoch `e` shuffled with `seed + e`.
#[derive(Debug, Clone, Copy)]
pub struct PlainTraining {
    /// Passes over the data.
    pub epochs: usize,
    /// Adam's learning rate.
    pub learning_rate: f64,
    /// Digits per step.
    pub batch_size: usize,
    /// The first epoch's shuffling seed.
    pub seed: u64,
}

impl PlainTraining {
    /// `epochs` at `learning_rate` from `seed`, in batches of 64.
    pub fn new(epochs: usize, learning_rate: f64, seed: u64) -> Self {
        Self {
            epochs,
            learning_rate,
            batch_size: 64,
            seed,
        }
    }
}

/// Trains `model`, whose logits `forward` gives, on `data` with cross-entropy and Adam as
/// `training` says: the examples' plain loop, outside burn-train's learner (no run directory,
/// no dashboard), so that the models a study compares see the same batches in the same order.
pub fn train_plain<B, M>(
    mut model: M,
    forward: impl Fn(&M, Tensor<B, 2>) -> Tensor<B, 2>,
    data: &DigitDataset,
    training: &PlainTraining,
) -> M
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let device = B::Device::default();
    let mut optimizer = AdamConfig::new().init();
    let loss = CrossEntropyLossConfig::new().init(&device);
    for epoch in 0..training.epochs {
        let loader = DataLoaderBuilder::new(DigitBatcher)
            .batch_size(training.batch_size)
            .shuffle(training.seed + epoch as u64)
            .build(data.clone());
        for batch in loader.iter() {
            let DigitBatch { images, targets } = batch;
            let value = loss.forward(forward(&model, images), targets);
            let grads = GradientsParams::from_grads(value.backward(), &model);
            model = optimizer.step(training.learning_rate, model, grads);
        }
        tracing::info!(epoch, "done");
    }
    model
}

/// A short description of the model, for logs and reports.
pub fn describe(model: &MlpConfig) -> String {
    if model.dense {
        format!("dense MLP {:?}", model.hidden)
    } else {
        format!(
            "sketched MLP {:?} (T={}, k={})",
            model.hidden, model.num_terms, model.low_rank
        )
    }
}

/// Mean cross-entropy and accuracy of `model` over `data`.
pub fn evaluate<B: SketchBackend>(
    model: &Mlp<B>,
    data: &DigitDataset,
    device: &B::Device,
) -> (f64, f64) {
    evaluate_logits(data, device, |x| model.forward(x))
}

/// Mean cross-entropy and accuracy over `data` (in batches of 500) of the logits `forward`
/// gives, for any classifier of the digits.
pub fn evaluate_logits<B: burn::tensor::backend::Backend>(
    data: &DigitDataset,
    device: &B::Device,
    forward: impl Fn(Tensor<B, 2>) -> Tensor<B, 2>,
) -> (f64, f64) {
    use burn::data::dataloader::batcher::Batcher;
    use burn::data::dataset::Dataset;

    let (mut loss_sum, mut correct) = (0.0, 0i64);
    let indices: Vec<usize> = (0..data.len()).collect();
    for chunk in indices.chunks(500) {
        let items = chunk.iter().filter_map(|&i| data.get(i)).collect();
        let batch: DigitBatch<B> = DigitBatcher.batch(items, device);
        let output = crate::mlp::classification(forward(batch.images), batch.targets);
        loss_sum += output.loss.into_scalar().elem::<f64>() * chunk.len() as f64;
        let predicted = output.output.argmax(1).reshape([chunk.len()]);
        correct += predicted
            .equal(output.targets)
            .int()
            .sum()
            .into_scalar()
            .elem::<i64>();
    }
    let n = data.len().max(1) as f64;
    (loss_sum / n, correct as f64 / n)
}

/// Clears an earlier run (fresh start) or finds the epoch to resume from, and saves the
/// configuration next to the checkpoints.
fn prepare_dir(config: &TrainingConfig, dir: &Path, resume: bool) -> Result<usize, TrainingError> {
    let io = |source| TrainingError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    let saved = dir.join("config.json");
    if resume {
        if let Some(epoch) = latest_checkpoint(dir) {
            let mismatch = |reason: String| TrainingError::ConfigMismatch {
                path: dir.to_path_buf(),
                reason,
            };
            let before = TrainingConfig::load(&saved).map_err(|e| mismatch(e.to_string()))?;
            // Only the length of the run may change between a run and its continuation.
            let comparable = |c: &TrainingConfig| {
                let mut c = c.clone();
                c.epochs = 0;
                c.workers = 0;
                // How the steps are spread over devices and processes does not change them.
                c.devices = 0;
                c.mpi = false;
                c.collective_timeout_secs = 0;
                c.threads_per_peer = None;
                c.to_string()
            };
            if comparable(&before) != comparable(config) {
                return Err(mismatch(format!("saved {before}, asked {config}")));
            }
            return Ok(epoch);
        }
        tracing::warn!(
            "nothing to resume in {}: starting a fresh run",
            dir.display()
        );
    }
    for sub in ["checkpoint", "train", "valid"] {
        let path = dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(io)?;
        }
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    // Written aside and renamed, like the checkpoints: a run killed now leaves no half file.
    let staging = dir.join(".config.json.partial");
    config.save(&staging).map_err(io)?;
    std::fs::rename(&staging, &saved).map_err(io)?;
    Ok(0)
}
