//! The serving example's pieces: the served models (the MNIST classifier, the character
//! language model and the all-MiniLM-L6-v2 sentence encoder, [`encoder`]), their checkpoints,
//! a load generator ([`loadgen`]) and a run of mixed good and bad requests ([`mixed`]).
//!
//! A package of its own, apart from `examples`: an example links every dependency of its
//! package, and the HTTP stack (burn-serve, axum, hyper, tokio) stays out of the other
//! examples' builds, the README's first command's among them. The models, their data and their
//! training come from `examples`.
//!
//! ```text
//! cargo run --release -p examples-serve --example serve -- --port 8000
//! ```

pub mod encoder;
pub mod loadgen;
pub mod mixed;

/// The book's serving page (`docs/src/serving.md`), compiled and run as a doctest here, where
/// burn-serve is a dependency (the other pages are doctests of `examples`, in `book.rs`).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/src/serving.md")]
pub struct ServingPage;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use burn::backend::{Autodiff, Flex};
use burn::config::Config;
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{DefaultRecorder, Recorder};
use burn::tensor::ElementConversion;
use burn::tensor::backend::Backend;
use burn_serve::{DataType, ModelSpec, TensorSpec};
use burn_store::{BurnpackStore, ModuleSnapshot};

use examples::lm::{Corpus, FORTUNES_DIR, Positions, TransformerLm, TransformerLmConfig, VOCAB};
use examples::mlp::{Mlp, MlpConfig};
use examples::mnist::Mnist;
use examples::training::{TrainingConfig, checkpoint_path, latest_checkpoint};

/// Pixels of one digit, the classifier's input row.
pub const MNIST_PIXELS: usize = 784;

/// The classifier's signature: `input` `FP32 [-1, 784]` (pixels in `[0, 1]`) to `logits`
/// `FP32 [-1, 10]`.
pub fn mnist_spec(platform: &str) -> ModelSpec {
    ModelSpec {
        name: "mnist".into(),
        version: "1".into(),
        platform: platform.into(),
        input: TensorSpec::rows("input", DataType::Fp32, &[MNIST_PIXELS]),
        output: TensorSpec::rows("logits", DataType::Fp32, &[10]),
    }
}

/// The language model's signature: `tokens` `INT64 [-1, context]` (character ids, see
/// [`examples::lm::Corpus`]) to `logits` `FP32 [-1, vocab]`, the next character's.
pub fn charlm_spec(platform: &str, context: usize) -> ModelSpec {
    ModelSpec {
        name: "charlm".into(),
        version: "1".into(),
        platform: platform.into(),
        input: TensorSpec::rows("tokens", DataType::Int64, &[context]),
        output: TensorSpec::rows("logits", DataType::Fp32, &[VOCAB]),
    }
}

/// A Burnpack checkpoint (`.bpk`, Burn's own format, read memory-mapped) with the model's
/// configuration beside it (`.json`).
fn config_path(checkpoint: &Path) -> PathBuf {
    checkpoint.with_extension("json")
}

/// Writes `model` to `path` (`.bpk`) and `config` beside it.
pub fn save<B: Backend, M: Module<B>, C: Config>(
    model: &M,
    config: &C,
    path: &Path,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut store = BurnpackStore::from_file(path).overwrite(true);
    model
        .save_into(&mut store)
        .with_context(|| format!("cannot write {}", path.display()))?;
    config
        .save(config_path(path))
        .with_context(|| format!("cannot write {}", config_path(path).display()))?;
    Ok(())
}

/// The configuration saved beside the checkpoint `path`, and the checkpoint applied to the
/// model `init` builds from it (the file memory-mapped while its tensors are read).
pub fn load<B: Backend, M: Module<B>, C: Config>(
    path: &Path,
    init: impl FnOnce(&C) -> M,
) -> anyhow::Result<(M, C)> {
    let config = C::load(config_path(path)).with_context(|| {
        format!(
            "cannot read the configuration {} that goes with {}",
            config_path(path).display(),
            path.display()
        )
    })?;
    let mut model = init(&config);
    let mut store = BurnpackStore::from_file(path);
    let result = model
        .load_from(&mut store)
        .with_context(|| format!("cannot load {}", path.display()))?;
    if !result.errors.is_empty() || !result.missing.is_empty() {
        bail!(
            "{} does not fit the model: {} missing tensors, errors {:?}",
            path.display(),
            result.missing.len(),
            result.errors
        );
    }
    Ok((model, config))
}

/// The MNIST classifier's Burnpack checkpoint: `checkpoint` if it is one; the newest
/// checkpoint of a `train_mnist` run directory, converted into `dir`; else the one this
/// example trained before in `dir`, else one trained now (`epochs` on the embedded digits, as
/// `train_mnist` trains, sketched or `dense`) and saved there. Load it with [`load`] on any
/// backend.
pub fn mnist_checkpoint(
    checkpoint: Option<&Path>,
    dir: &Path,
    epochs: usize,
    dense: bool,
) -> anyhow::Result<PathBuf> {
    let device = Default::default();
    Ok(match checkpoint {
        Some(run) if run.is_dir() => {
            let (model, config) = from_run_dir(run)?;
            let path = dir.join("mnist-from-run.bpk");
            save(&model, &config, &path)?;
            path
        }
        Some(path) => path.to_path_buf(),
        None => {
            let kind = if dense { "dense" } else { "sketched" };
            let path = dir.join(format!("mnist-{kind}.bpk"));
            if !path.exists() {
                let config =
                    TrainingConfig::new(MlpConfig::new().with_dense(dense)).with_epochs(epochs);
                let run = dir.join(format!("mnist-{kind}-run"));
                println!("no checkpoint given: training the classifier ({epochs} epochs)");
                let report = examples::training::train::<Autodiff<Flex>>(
                    &config,
                    &Mnist::embedded_dir(),
                    &run,
                    false,
                    &device,
                )?;
                println!("test accuracy {:.2} %", report.test_accuracy * 100.0);
                let (model, model_config) = from_run_dir(&run)?;
                save(&model, &model_config, &path)?;
            }
            path
        }
    })
}

/// The newest checkpoint of a `train_mnist` run directory.
fn from_run_dir(dir: &Path) -> anyhow::Result<(Mlp<Flex>, MlpConfig)> {
    let config = TrainingConfig::load(dir.join("config.json"))
        .with_context(|| format!("{} is not a train_mnist run directory", dir.display()))?;
    let epoch = latest_checkpoint(dir)
        .with_context(|| format!("{} holds no complete checkpoint", dir.display()))?;
    let device = Default::default();
    let record = DefaultRecorder::new()
        .load(checkpoint_path(dir, epoch), &device)
        .with_context(|| format!("cannot read epoch {epoch} of {}", dir.display()))?;
    let model = config.model.init::<Flex>(&device).load_record(record);
    Ok((model, config.model))
}

/// The character language model: `checkpoint` if given, else the one trained before in `dir`,
/// else trained now for `steps` steps on Debian's `fortunes` (or `text`) and saved there.
pub fn charlm_model(
    checkpoint: Option<&Path>,
    dir: &Path,
    steps: usize,
    text: Option<&Path>,
) -> anyhow::Result<(TransformerLm<Flex>, TransformerLmConfig)> {
    let device = Default::default();
    let path = checkpoint
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.join("charlm.bpk"));
    if checkpoint.is_none() && !path.exists() {
        let documents = match text {
            Some(text) => Corpus::read_text(text)?,
            None => Corpus::read_fortunes(Path::new(FORTUNES_DIR))?,
        };
        let corpus = Corpus::split(&documents, 10, 10_000)?;
        let config = TransformerLmConfig::new()
            .with_context(32)
            .with_d_model(64)
            .with_n_blocks(2)
            .with_d_ff(256)
            .with_dropout(0.0);
        println!("no language model given: training one ({steps} steps)");
        let mut model = config.init::<Autodiff<Flex>>(&device);
        let mut optim = AdamConfig::new().init();
        let mut positions = Positions::new(7);
        let mut loss = f64::NAN;
        for _ in 0..steps {
            let starts = positions.starts(32, corpus.train.len(), config.context);
            let batch = examples::lm::batch(&corpus.train, &starts, config.context, &device);
            let value = model.forward_loss(&batch);
            loss = value.clone().into_scalar().elem::<f64>();
            let grads = GradientsParams::from_grads(value.backward(), &model);
            model = optim.step(3e-3, model, grads);
        }
        println!(
            "language model trained: last loss {:.3} bits per character",
            loss / std::f64::consts::LN_2
        );
        save(&model.valid(), &config, &path)?;
    }
    load(&path, |config: &TransformerLmConfig| config.init(&device))
}
