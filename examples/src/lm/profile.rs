//! `language_model --profile DIR`: a few training steps of a model on
//! `Autodiff<Profiled<B>>`, recorded by burn-profiler's [`StepProfiler`].
//!
//! The study's own loop, not burn-train's learner: the same batches and Adam updates as its
//! arms train with. Each step runs its forward pass (the loss included), its backward pass and
//! its optimizer update in scopes `forward`, `backward` and `optimizer`, and the model names
//! its parts (`embedding`, `block 1`…, `head`), so the profile says which block and which
//! phase an operation, and the memory peak, belong to.

use std::path::PathBuf;

use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn_profiler::ProfileError;
use burn_profiler::{StepProfiler, scope};
use burn_sketch::SketchBackend;

use super::{Corpus, Positions, TransformerLm, batch};

/// The training a profile records steps of.
#[derive(Debug, Clone, Copy)]
pub struct ProfiledTraining {
    /// Sequences per batch.
    pub batch: usize,
    /// Context length.
    pub context: usize,
    /// Adam's learning rate.
    pub lr: f64,
    /// Seed of the batch positions.
    pub seed: u64,
    /// Steps to train: the profiler's skipped steps and its window.
    pub steps: usize,
}

/// Trains `model` for `training.steps` steps, telling `profiler` of each step's start, and
/// returns the directory its profile was written to. Each step ends with a device sync, so
/// that a lazy backend's work falls in the step that queued it.
///
/// # Errors
/// The profiler's (see [`StepProfiler::finish`]): it did not start, the steps ended before
/// its window opened, or its files could not be written.
pub fn train_profiled<B: AutodiffBackend + SketchBackend>(
    mut model: TransformerLm<B>,
    corpus: &Corpus,
    device: &B::Device,
    training: ProfiledTraining,
    profiler: &StepProfiler,
) -> Result<PathBuf, ProfileError> {
    let mut optim = AdamConfig::new().init::<B, TransformerLm<B>>();
    let mut positions = Positions::new(training.seed);
    for _ in 0..training.steps {
        profiler.step();
        let starts = positions.starts(training.batch, corpus.train.len(), training.context);
        let data = batch::<B>(&corpus.train, &starts, training.context, device);
        let loss = {
            let _forward = scope("forward");
            model.forward_loss(&data)
        };
        let grads = {
            let _backward = scope("backward");
            GradientsParams::from_grads(loss.backward(), &model)
        };
        model = {
            let _optimizer = scope("optimizer");
            optim.step(training.lr, model, grads)
        };
        // A lazy backend's work inside its step (recorded as the operation `sync`).
        B::sync(device).expect("the device syncs");
    }
    profiler.finish()
}
