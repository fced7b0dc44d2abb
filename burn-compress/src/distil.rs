//! Distillation: training a converted (low-rank, sketched) model to reproduce the hidden states
//! of the original, on unlabeled inputs. A conversion at a fraction of the parameters moves
//! every later state away from the original's; matching those states again is the cheap
//! fine-tuning step that recovers what the conversion lost, with no labels and no task loss.
//!
//! - [`Distillable`]: what a model shows to be distilled: the states to match (some per-layer,
//!   one output, each `[batch, seq, width]`) and which positions count.
//! - [`DistilConfig`]: the learning rate and its schedule, the weights of the per-layer and
//!   output terms, the loss, a step or time budget, the compute precision, the seed.
//! - [`distil`]: the training loop (AdamW) of a student against a frozen teacher, returning a
//!   [`DistilReport`].
//!
//! **The teacher runs on the inner backend** (the student's `AutodiffModule::InnerModule`):
//! no graph is recorded for it, and its dropout is off, so its states are the deterministic
//! targets the student must reach. Inputs are built once for the student and moved to the
//! teacher's backend by [`DistilInput`].
//!
//! **Memory tools.** The compute precision is burn-memory's [`MixedPrecision`]: with
//! [`Precision::Bf16`] the student's forward and backward run in `bf16` over `f32` master
//! weights (the loss is always computed in `f32`). Activation checkpointing is a property of
//! the autodiff backend in Burn (`Autodiff<B, BalancedCheckpointing>`, burn-memory's
//! [`Checkpointing`](burn_memory::Checkpointing)): [`distil`] is generic over the backend and
//! so runs under either strategy. burn-memory's segment checkpointing does not apply: it
//! backpropagates one loss at the sequence's end, and distillation has a loss term at every
//! matched layer.

use std::ops::ControlFlow;
use std::time::Instant;

use burn::config::Config;
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, ElementConversion, Tensor};
use burn_memory::{LossScale, MixedPrecisionConfig, Precision, StepOutcome};
use serde::{Deserialize, Serialize};

use crate::CompressError;

/// The hidden states a model exposes for distillation, for one input batch.
#[derive(Clone, Debug)]
pub struct DistilStates<B: Backend> {
    /// Intermediate states to match (a transformer's layer outputs but the last), each
    /// `[batch, seq, width]`; widths may differ from one state to the next.
    pub layers: Vec<Tensor<B, 3>>,
    /// The output state, `[batch, seq, width]`.
    pub output: Tensor<B, 3>,
    /// Weight of each position, `[batch, seq]`: 1 for a real token, 0 for padding. `None`:
    /// every position counts.
    pub weights: Option<Tensor<B, 2>>,
}

/// A model whose hidden states can be distilled: any Burn model, as long as teacher and student
/// are the same type (the student being the teacher with some layers converted).
pub trait Distillable<B: Backend> {
    /// One batch of input.
    type Input;
    /// The states to match for `input`, as [`DistilStates`].
    fn distil_states(&self, input: &Self::Input) -> DistilStates<B>;
}

/// An input on an autodiff backend that can be moved to its inner backend, where the teacher
/// runs.
pub trait DistilInput<B: AutodiffBackend> {
    /// The same input on `B::InnerBackend`.
    type Inner;
    /// The input for the teacher.
    fn to_inner(&self) -> Self::Inner;
}

impl<B: AutodiffBackend, const D: usize> DistilInput<B> for Tensor<B, D> {
    type Inner = Tensor<B::InnerBackend, D>;
    fn to_inner(&self) -> Self::Inner {
        self.clone().inner()
    }
}

impl<B: AutodiffBackend, A: DistilInput<B>, C: DistilInput<B>> DistilInput<B> for (A, C) {
    type Inner = (A::Inner, C::Inner);
    fn to_inner(&self) -> Self::Inner {
        (self.0.to_inner(), self.1.to_inner())
    }
}

/// How far a student state is from the teacher's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DistilLoss {
    /// The squared error over real tokens, divided by the teacher state's variance (over
    /// tokens and width): a state's term is 1 for a student that outputs the teacher's mean,
    /// whatever the state's scale, so layers of different magnitude weigh alike. It matches
    /// magnitudes as well as directions, which the next layer's input needs.
    #[default]
    NormalizedMse,
    /// `1 − cosine` between student and teacher, per real token: directions only, what a
    /// cosine-compared embedding needs, blind to a token's norm.
    Cosine,
}

/// Settings of a distillation run ([`distil`]).
#[derive(Config, Debug)]
pub struct DistilConfig {
    /// AdamW's peak learning rate.
    #[config(default = 1e-4)]
    pub learning_rate: f64,
    /// The learning rate at the end of the budget, as a fraction of the peak: the schedule is
    /// a linear warm-up, then a cosine decay over the budget (steps or time, whichever is
    /// further along).
    #[config(default = 0.1)]
    pub final_learning_rate: f64,
    /// Steps of linear warm-up (Adam's moments are poor estimates at first).
    #[config(default = 20)]
    pub warmup_steps: usize,
    /// Weight of the per-layer term (the mean over [`DistilStates::layers`]).
    #[config(default = 1.0)]
    pub layer_weight: f64,
    /// Weight of the output term.
    #[config(default = 1.0)]
    pub output_weight: f64,
    /// The distance between states.
    #[config(default = "DistilLoss::NormalizedMse")]
    pub loss: DistilLoss,
    /// Stop after this many steps.
    pub max_steps: Option<usize>,
    /// Stop after this many seconds of training (time spent in the step callback excluded).
    pub max_seconds: Option<f64>,
    /// AdamW's decoupled weight decay; 0 keeps the student from drifting toward zero away from
    /// the converted weights it starts from.
    #[config(default = 0.0)]
    pub weight_decay: f32,
    /// Clip the gradients' global norm to this value.
    pub grad_clip_norm: Option<f32>,
    /// The student's compute precision (master weights stay `f32`).
    #[config(default = "Precision::F32")]
    pub precision: Precision,
    /// Seed of the backend's generator (dropout masks in the student).
    #[config(default = 42)]
    pub seed: u64,
}

/// One step's numbers, given to [`distil`]'s callback.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DistilStep {
    /// Steps done (from 1).
    pub step: usize,
    /// Seconds of training so far (callback time excluded).
    pub seconds: f64,
    /// This step's loss.
    pub loss: f32,
    /// The learning rate the step used.
    pub learning_rate: f64,
}

/// What a distillation run did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DistilReport {
    /// Steps taken (skipped ones included).
    pub steps: usize,
    /// Seconds of training (callback time excluded).
    pub seconds: f64,
    /// Seconds in the callback (evaluations).
    pub callback_seconds: f64,
    /// The loss of every step, in order.
    pub losses: Vec<f32>,
    /// Steps that mixed precision skipped for non-finite gradients.
    pub skipped_steps: usize,
}

impl DistilReport {
    /// The mean loss of the first and of the last `window` steps (fewer if the run was
    /// shorter): a loss curve summarised without one step's noise.
    pub fn first_last(&self, window: usize) -> Option<(f32, f32)> {
        if self.losses.is_empty() {
            return None;
        }
        let w = window.clamp(1, self.losses.len());
        let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len() as f32;
        Some((
            mean(&self.losses[..w]),
            mean(&self.losses[self.losses.len() - w..]),
        ))
    }
}

impl DistilConfig {
    fn check(&self) -> Result<(), CompressError> {
        let bad = |what: String| Err(CompressError::Unsupported { what });
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return bad(format!(
                "learning rate {}: must be positive",
                self.learning_rate
            ));
        }
        if !(0.0..=1.0).contains(&self.final_learning_rate) {
            return Err(CompressError::InvalidFraction {
                name: "final_learning_rate",
                value: self.final_learning_rate,
            });
        }
        if self.layer_weight < 0.0
            || self.output_weight < 0.0
            || self.layer_weight + self.output_weight <= 0.0
        {
            return bad(format!(
                "layer weight {} and output weight {}: non-negative, not both 0",
                self.layer_weight, self.output_weight
            ));
        }
        if self.max_steps.is_none() && self.max_seconds.is_none() {
            return bad("a distillation without max_steps or max_seconds would not end".into());
        }
        Ok(())
    }

    /// The learning rate of step `step` (from 0) at budget fraction `progress`.
    fn rate(&self, step: usize, progress: f64) -> f64 {
        let warm = ((step + 1) as f64 / self.warmup_steps.max(1) as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress.clamp(0.0, 1.0)).cos());
        self.learning_rate
            * warm
            * (self.final_learning_rate + (1.0 - self.final_learning_rate) * cosine)
    }
}

/// Trains `student` to reproduce `teacher`'s states ([`Distillable`]) on the batches that
/// `batches` gives for each step (from 0), with AdamW, until the config's step or time budget
/// is spent or `on_step` breaks. Returns the trained student and the run's report.
///
/// `teacher` is the original model on the inner backend (for instance `original.valid()`);
/// its states are computed without a graph. Errors: an invalid configuration, a compute
/// precision the device lacks, states whose count or shapes differ between teacher and
/// student, a loss that is not finite.
pub fn distil<B, M>(
    teacher: &M::InnerModule,
    mut student: M,
    config: &DistilConfig,
    mut batches: impl FnMut(usize) -> M::Input,
    mut on_step: impl FnMut(&DistilStep, &M) -> ControlFlow<()>,
) -> Result<(M, DistilReport), CompressError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Distillable<B>,
    M::Input: DistilInput<B, Inner = <M::InnerModule as Distillable<B::InnerBackend>>::Input>,
    M::InnerModule: Distillable<B::InnerBackend>,
{
    config.check()?;
    let device =
        student
            .devices()
            .into_iter()
            .next()
            .ok_or_else(|| CompressError::Unsupported {
                what: "a student without parameters has nothing to train".into(),
            })?;
    B::seed(&device, config.seed);
    let loss_scale = match config.precision {
        Precision::F16 => LossScale::dynamic(),
        _ => LossScale::Static(1.0),
    };
    let mut amp = MixedPrecisionConfig::new()
        .with_compute(config.precision)
        .with_loss_scale(loss_scale)
        .init::<B>(&device)
        .map_err(|err| CompressError::Unsupported {
            what: format!("mixed precision: {err}"),
        })?;
    let mut optim = AdamWConfig::new()
        .with_weight_decay(config.weight_decay)
        .with_grad_clipping(
            config
                .grad_clip_norm
                .map(burn::grad_clipping::GradientClippingConfig::Norm),
        )
        .init::<B, M>();

    let mut report = DistilReport::default();
    let start = Instant::now();
    let mut step = 0;
    loop {
        let seconds = start.elapsed().as_secs_f64() - report.callback_seconds;
        let by_steps = config.max_steps.map(|n| step as f64 / n.max(1) as f64);
        let by_time = config.max_seconds.map(|s| seconds / s.max(1e-9));
        let progress = by_steps.into_iter().chain(by_time).fold(0.0, f64::max);
        if progress >= 1.0 {
            break;
        }
        let input = batches(step);
        let target = teacher.distil_states(&input.to_inner());
        let compute = amp.cast_module(&student);
        let states = compute.distil_states(&input);
        let loss = distil_loss::<B>(states, target, config)?;
        let value = loss.clone().into_scalar().elem::<f32>();
        if !value.is_finite() {
            return Err(CompressError::Unsupported {
                what: format!("the distillation loss is {value} at step {}", step + 1),
            });
        }
        let grads = GradientsParams::from_grads(amp.scale_loss(loss).backward(), &student);
        let rate = config.rate(step, progress);
        let outcome;
        (student, outcome) = amp.step(&mut optim, rate, student, grads);
        if outcome == StepOutcome::Skipped {
            report.skipped_steps += 1;
        }
        step += 1;
        report.losses.push(value);
        let info = DistilStep {
            step,
            seconds: start.elapsed().as_secs_f64() - report.callback_seconds,
            loss: value,
            learning_rate: rate,
        };
        let callback = Instant::now();
        let flow = on_step(&info, &student);
        report.callback_seconds += callback.elapsed().as_secs_f64();
        if flow.is_break() {
            break;
        }
    }
    report.steps = step;
    report.seconds = start.elapsed().as_secs_f64() - report.callback_seconds;
    tracing::debug!(
        steps = report.steps,
        seconds = report.seconds,
        "distillation done"
    );
    Ok((student, report))
}

/// The weighted distillation loss of student `states` (on `B`) against the teacher's `target`
/// (on the inner backend, moved over without a graph), in `f32`.
fn distil_loss<B: AutodiffBackend>(
    states: DistilStates<B>,
    target: DistilStates<B::InnerBackend>,
    config: &DistilConfig,
) -> Result<Tensor<B, 1>, CompressError> {
    if states.layers.len() != target.layers.len() {
        return Err(CompressError::ShapeMismatch {
            key: "distil_states.layers".into(),
            found: vec![states.layers.len()],
            expected: format!("{} states, as the teacher's", target.layers.len()),
        });
    }
    let weights = target.weights.map(Tensor::<B, 2>::from_inner);
    let lift = |t: Tensor<B::InnerBackend, 3>| Tensor::<B, 3>::from_inner(t.cast(DType::F32));
    let mut total: Option<Tensor<B, 1>> = None;
    let mut add = |term: Tensor<B, 1>, weight: f64| {
        let term = term.mul_scalar(weight);
        total = Some(match total.take() {
            Some(sum) => sum + term,
            None => term,
        });
    };
    let n_layers = states.layers.len();
    if n_layers > 0 && config.layer_weight > 0.0 {
        for (index, (s, t)) in states.layers.into_iter().zip(target.layers).enumerate() {
            let term = state_loss(s, lift(t), weights.clone(), config.loss, index)?;
            add(term, config.layer_weight / n_layers as f64);
        }
    }
    if config.output_weight > 0.0 {
        let term = state_loss(
            states.output,
            lift(target.output),
            weights,
            config.loss,
            n_layers,
        )?;
        add(term, config.output_weight);
    }
    total.ok_or_else(|| CompressError::Unsupported {
        what: "no state to match: the model has no layers and the output weight is 0".into(),
    })
}

/// One state's loss, averaged over real positions.
fn state_loss<B: Backend>(
    student: Tensor<B, 3>,
    teacher: Tensor<B, 3>,
    weights: Option<Tensor<B, 2>>,
    loss: DistilLoss,
    index: usize,
) -> Result<Tensor<B, 1>, CompressError> {
    if student.dims() != teacher.dims() {
        return Err(CompressError::ShapeMismatch {
            key: format!("distil state {index}"),
            found: student.dims().to_vec(),
            expected: format!("{:?}, the teacher's", teacher.dims()),
        });
    }
    let [batch, seq, width] = teacher.dims();
    let student = student.cast(DType::F32);
    let weights = match weights {
        Some(w) => w.reshape([batch, seq, 1]),
        None => Tensor::ones([batch, seq, 1], &teacher.device()),
    };
    let count = weights.clone().sum().clamp_min(1.0);
    Ok(match loss {
        DistilLoss::NormalizedMse => {
            let cells = count.clone().mul_scalar(width as f64);
            let mean = (teacher.clone() * weights.clone()).sum().div(cells.clone());
            let centred = teacher.clone() - mean.reshape([1, 1, 1]);
            let variance = (centred.powi_scalar(2) * weights.clone())
                .sum()
                .div(cells.clone())
                .clamp_min(1e-12);
            let error = ((student - teacher).powi_scalar(2) * weights).sum();
            error.div(cells * variance)
        }
        DistilLoss::Cosine => {
            let cos = token_cosine(student, teacher);
            (cos.neg().add_scalar(1.0) * weights).sum().div(count)
        }
    })
}

/// The cosine of each token's student and teacher vectors, `[batch, seq, 1]`.
fn token_cosine<B: Backend>(a: Tensor<B, 3>, b: Tensor<B, 3>) -> Tensor<B, 3> {
    let norm = |t: &Tensor<B, 3>| t.clone().powi_scalar(2).sum_dim(2).sqrt();
    let (na, nb) = (norm(&a), norm(&b));
    (a * b).sum_dim(2).div((na * nb).clamp_min(1e-12))
}

/// The mean cosine, over real positions, between two models' output states for one input
/// (each `[batch, seq, width]`): a fidelity measure independent of any pooling.
pub fn output_cosine<B: Backend>(a: &DistilStates<B>, b: &DistilStates<B>) -> f64 {
    let [batch, seq, _] = a.output.dims();
    let cos = token_cosine(
        a.output.clone().cast(DType::F32),
        b.output.clone().cast(DType::F32),
    );
    let weights = match &a.weights {
        Some(w) => w.clone().reshape([batch, seq, 1]),
        None => Tensor::ones([batch, seq, 1], &a.output.device()),
    };
    let count = weights.clone().sum().into_scalar().elem::<f64>().max(1.0);
    (cos * weights).sum().into_scalar().elem::<f64>() / count
}
