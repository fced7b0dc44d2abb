//! Automatic mixed precision: a half-precision forward pass over f32 master weights, with loss
//! scaling so that small half-precision gradients do not flush to zero.
//!
//! The pieces, and why each is there:
//! - **Master weights stay f32.** [`MixedPrecision::cast_module`] returns a view of the model
//!   whose parameters are `cast` to the compute type. `cast` is differentiable, so the gradients
//!   flow back through it and arrive in f32, on the f32 parameters the optimizer updates. No
//!   precision is lost across steps.
//! - **Loss scaling.** The loss is multiplied by the scale before `backward`
//!   ([`MixedPrecision::scale_loss`]), which lifts small gradients into f16's range.
//!   [`MixedPrecision::step`] divides the gradients by the scale before the optimizer sees them.
//! - **Overflow handling.** If any gradient is infinite or NaN once unscaled, the step is
//!   skipped: the optimizer is not called and the weights and optimizer state are untouched.
//!   With a dynamic scale, the scale is halved (never below the smallest `f32` whose inverse is
//!   finite, with a warning when it falls below 1); after `growth_interval` clean steps in a
//!   row it doubles. These are the defaults of PyTorch's `GradScaler`.
//! - **Gradient accumulation** composes with it. Accumulate the *scaled* gradients of each
//!   micro-batch with Burn's `GradientsAccumulator`, and call `step` once. The scale only
//!   changes inside `step`, so every micro-batch used the same scale. One non-finite micro-batch
//!   skips the whole accumulated step.
//!
//! bf16 has f32's exponent range and rarely needs scaling; use `LossScale::Static(1.0)` with it.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::module::Module;
//! use burn::nn::LinearConfig;
//! use burn::optim::{GradientsParams, Optimizer, SgdConfig};
//! use burn::tensor::{Distribution, Tensor};
//! use burn_memory::{MixedPrecisionConfig, Precision, StepOutcome};
//!
//! type B = Autodiff<NdArray>;
//! let device = Default::default();
//! let mut model = LinearConfig::new(4, 1).init::<B>(&device);
//! let mut optim = SgdConfig::new().init();
//! // NdArray computes only in f32, so this shows the loss scaling; on Wgpu or Cuda use
//! // `Precision::F16` or `Precision::Bf16`.
//! let mut amp = MixedPrecisionConfig::new()
//!     .with_compute(Precision::F32)
//!     .init::<B>(&device)
//!     .unwrap();
//! let x = Tensor::<B, 2>::random([16, 4], Distribution::Default, &device);
//! let y = amp.cast_module(&model).forward(amp.cast_input(x));
//! let loss = y.powi_scalar(2).mean();
//! let grads = GradientsParams::from_grads(amp.scale_loss(loss).backward(), &model);
//! let outcome;
//! (model, outcome) = amp.step(&mut optim, 0.1, model, grads);
//! assert_eq!(outcome, StepOutcome::Applied);
//! ```

use burn::config::Config;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor};
use serde::{Deserialize, Serialize};

use crate::{MemoryError, draw_params};

/// The element type of the forward and backward computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    /// Full precision: AMP is then loss scaling only.
    F32,
    /// IEEE half precision: 10-bit mantissa, range ±65504, needs loss scaling.
    F16,
    /// bfloat16: f32's range with an 8-bit mantissa, rarely needs loss scaling.
    Bf16,
}

impl Precision {
    /// The tensor element type.
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F16 => DType::F16,
            Self::Bf16 => DType::BF16,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = MemoryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::Bf16),
            other => Err(MemoryError::invalid(
                "precision",
                format!("`{other}`: expected f32, f16 or bf16"),
            )),
        }
    }
}

/// How the loss is scaled before backward.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum LossScale {
    /// A fixed factor. Steps with non-finite gradients are still skipped.
    Static(f32),
    /// A factor that adapts to the gradients (PyTorch `GradScaler` semantics).
    Dynamic {
        /// The first scale.
        initial: f32,
        /// Multiplier after `growth_interval` clean steps in a row.
        growth_factor: f32,
        /// Multiplier after a step with non-finite gradients.
        backoff_factor: f32,
        /// Clean steps in a row before the scale grows.
        growth_interval: usize,
    },
}

impl LossScale {
    /// PyTorch's `GradScaler` defaults: 2¹⁶, ×2 after 2000 clean steps, ×½ on overflow.
    pub fn dynamic() -> Self {
        Self::Dynamic {
            initial: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }

    fn initial(&self) -> f32 {
        match *self {
            Self::Static(scale) => scale,
            Self::Dynamic { initial, .. } => initial,
        }
    }
}

/// Settings of a mixed-precision run.
#[derive(Config, Debug)]
pub struct MixedPrecisionConfig {
    /// Element type of the forward and backward computation.
    #[config(default = "Precision::F16")]
    pub compute: Precision,
    /// Loss scaling.
    #[config(default = "LossScale::dynamic()")]
    pub loss_scale: LossScale,
}

impl MixedPrecisionConfig {
    /// The run's state on `device`. Fails with [`MemoryError::UnsupportedPrecision`] when the
    /// device cannot compute in the requested type (NdArray has only f32 and f64), and with
    /// [`MemoryError::Invalid`] for a scale that is not finite and positive or whose inverse,
    /// the factor the gradients are unscaled by, is not finite (below about 2.9·10⁻³⁹).
    pub fn init<B: AutodiffBackend>(
        &self,
        device: &B::Device,
    ) -> Result<MixedPrecision, MemoryError> {
        let dtype = self.compute.dtype();
        if self.compute != Precision::F32 && !B::supports_dtype(device, dtype) {
            return Err(MemoryError::UnsupportedPrecision(dtype));
        }
        let scale = self.loss_scale.initial();
        check_scale("loss scale", scale)?;
        if let LossScale::Dynamic {
            growth_factor,
            backoff_factor,
            growth_interval,
            ..
        } = self.loss_scale
            && !(growth_factor >= 1.0
                && backoff_factor > 0.0
                && backoff_factor < 1.0
                && growth_interval > 0)
        {
            return Err(MemoryError::invalid(
                "dynamic loss scale",
                format!(
                    "growth {growth_factor} (≥ 1), backoff {backoff_factor} (in (0, 1)), \
                     interval {growth_interval} (> 0)"
                ),
            ));
        }
        Ok(MixedPrecision {
            compute: self.compute,
            loss_scale: self.loss_scale,
            scale,
            clean_steps: 0,
            skipped_steps: 0,
        })
    }
}

/// The state of a mixed-precision run that a training checkpoint keeps
/// ([`MixedPrecision::record`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MixedPrecisionRecord {
    /// The loss scale.
    pub scale: f32,
    /// Clean steps since the scale last changed (a dynamic scale grows after enough of them).
    pub clean_steps: u64,
    /// Steps skipped for non-finite gradients.
    pub skipped_steps: u64,
}

/// One line: the compute type, the scale and the skipped steps.
impl std::fmt::Display for MixedPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let policy = match self.loss_scale {
            LossScale::Dynamic { .. } => "dynamic",
            LossScale::Static(_) => "static",
        };
        write!(
            f,
            "mixed precision {:?}, loss scale {} ({policy}), {} step(s) skipped",
            self.compute, self.scale, self.skipped_steps
        )
    }
}

/// What [`MixedPrecision::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// The optimizer updated the weights.
    Applied,
    /// A gradient was infinite or NaN: nothing was updated and the scale backed off.
    Skipped,
}

/// The state of a mixed-precision run: the current loss scale and its counters.
#[derive(Clone, Debug)]
pub struct MixedPrecision {
    compute: Precision,
    loss_scale: LossScale,
    scale: f32,
    clean_steps: usize,
    skipped_steps: usize,
}

impl MixedPrecision {
    /// The compute precision.
    pub fn precision(&self) -> Precision {
        self.compute
    }

    /// The current loss scale.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// How many steps were skipped for non-finite gradients so far.
    pub fn skipped_steps(&self) -> usize {
        self.skipped_steps
    }

    /// What a training checkpoint keeps of the run: the loss scale and its counters.
    pub fn record(&self) -> MixedPrecisionRecord {
        MixedPrecisionRecord {
            scale: self.scale,
            clean_steps: self.clean_steps as u64,
            skipped_steps: self.skipped_steps as u64,
        }
    }

    /// Continues the run from a checkpoint's [`record`](Self::record) (the precision and the
    /// scaling policy stay this run's). A scale [`MixedPrecisionConfig::init`] would refuse is
    /// refused here too, with [`MemoryError::Invalid`].
    pub fn load_record(&mut self, record: MixedPrecisionRecord) -> Result<(), MemoryError> {
        check_scale("recorded loss scale", record.scale)?;
        self.scale = record.scale;
        self.clean_steps = record.clean_steps as usize;
        self.skipped_steps = record.skipped_steps as usize;
        Ok(())
    }

    /// The model with its float parameters cast to the compute type, for the forward pass.
    /// The f32 parameters of `module` remain the ones the gradients belong to: compute the
    /// gradients with `GradientsParams::from_grads(grads, module)`.
    ///
    /// Parameters that are still lazily uninitialised are initialised in `module` first: a
    /// clone of an uninitialised Burn parameter initialises separately, which would give the
    /// forward pass different weights from the ones the optimizer updates.
    ///
    /// State that Burn shares between a module and its clones, such as `BatchNorm`'s running
    /// statistics, is cast in place (there is one copy of it), so that the compute copy's
    /// forward can update it in the compute type; [`unscale`](Self::unscale) (and so
    /// [`step`](Self::step)) casts it back to f32 in `module` after the step.
    pub fn cast_module<B: AutodiffBackend, M: Module<B>>(&self, module: &M) -> M {
        draw_params(module);
        if self.compute == Precision::F32 {
            return module.clone();
        }
        module.clone().map(&mut CastParams(self.compute.dtype()))
    }

    /// An input cast to the compute type.
    pub fn cast_input<B: AutodiffBackend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        if self.compute == Precision::F32 {
            return x;
        }
        x.cast(self.compute.dtype())
    }

    /// The loss in f32, times the current scale: call `backward` on this.
    pub fn scale_loss<B: AutodiffBackend, const D: usize>(
        &self,
        loss: Tensor<B, D>,
    ) -> Tensor<B, D> {
        loss.cast(DType::F32).mul_scalar(self.scale)
    }

    /// Unscales `grads` (scaled gradients of `module`), then either runs the optimizer or, if any
    /// gradient is infinite or NaN, skips the step and leaves `module` untouched. Updates the
    /// loss scale. Returns the module to use next and what happened.
    pub fn step<B, M, O>(
        &mut self,
        optimizer: &mut O,
        learning_rate: f64,
        module: M,
        grads: GradientsParams,
    ) -> (M, StepOutcome)
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        match self.unscale(&module, grads) {
            Some(grads) => (
                optimizer.step(learning_rate, module, grads),
                StepOutcome::Applied,
            ),
            None => (module, StepOutcome::Skipped),
        }
    }

    /// The half of [`step`](Self::step) before the optimizer, for loops that call the
    /// optimizer elsewhere, such as burn-train's `Learner`, which steps with the gradients a
    /// `TrainStep` returns. Unscales `grads` (scaled gradients of `module`) and updates the
    /// loss scale: `Some` with the true gradients when all are finite, `None` when the step
    /// must be skipped. An empty `GradientsParams` skips it in a `TrainStep`: Burn's
    /// optimizers leave a parameter without a gradient, and its state, untouched.
    pub fn unscale<B, M>(&mut self, module: &M, grads: GradientsParams) -> Option<GradientsParams>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        // Running statistics that the compute copy updated in the compute type, back to f32.
        self.restore_shared_state(module);
        // In a data-parallel step, the mean over every peer of the still-scaled gradients:
        // every peer then checks the same values and takes the same skip decision.
        // (See `hooks`: the strategy puts the reduction in scope for the step.)
        let grads = crate::hooks::reduce_in_scope(grads);
        let mut grads = grads;
        // The check runs on the unscaled gradients, as PyTorch's `GradScaler` does: a finite
        // scaled gradient can still overflow once divided by a small scale.
        let mut unscale = Unscale::<B> {
            grads: &mut grads,
            factor: 1.0 / self.scale,
            non_finite: None,
        };
        module.visit(&mut unscale);
        let non_finite = unscale
            .non_finite
            .map(|count| count.into_scalar().elem::<i64>() > 0)
            .unwrap_or(false);

        if non_finite {
            self.skipped_steps += 1;
            self.clean_steps = 0;
            if let LossScale::Dynamic { backoff_factor, .. } = self.loss_scale {
                let before = self.scale;
                self.scale = (self.scale * backoff_factor).max(MIN_DYNAMIC_SCALE);
                if before >= COLLAPSE_WARNING && self.scale < COLLAPSE_WARNING {
                    tracing::warn!(
                        "mixed precision: the loss scale collapsed below {COLLAPSE_WARNING} \
                         after {} skipped step(s): the gradients are non-finite even \
                         unscaled, so the loss is likely NaN or diverging",
                        self.skipped_steps
                    );
                }
            }
            tracing::warn!(
                "mixed precision: non-finite gradients, step skipped; loss scale now {}",
                self.scale
            );
            return None;
        }

        self.clean_steps += 1;
        if let LossScale::Dynamic {
            growth_factor,
            growth_interval,
            ..
        } = self.loss_scale
            && self.clean_steps >= growth_interval
        {
            self.clean_steps = 0;
            if (self.scale * growth_factor).is_finite() {
                self.scale *= growth_factor;
                tracing::debug!("mixed precision: loss scale grows to {}", self.scale);
            }
        }
        Some(grads)
    }
}

use burn::tensor::ElementConversion;

/// The smallest a dynamic scale backs off to: the unscaling factor `1/scale` stays finite, so
/// a run whose scale keeps shrinking skips steps rather than multiplying gradients by infinity.
const MIN_DYNAMIC_SCALE: f32 = f32::MIN_POSITIVE;

/// A dynamic scale below this means the gradients overflowed even at a scale of 1: not a
/// precision problem the scale can fix. Crossing it is worth a warning of its own.
const COLLAPSE_WARNING: f32 = 1.0;

/// Refuses a scale that is not finite and positive, or whose inverse is not finite.
fn check_scale(name: &'static str, scale: f32) -> Result<(), MemoryError> {
    if scale.is_finite() && scale > 0.0 && (1.0 / scale).is_finite() {
        Ok(())
    } else {
        Err(MemoryError::invalid(
            name,
            format!("{scale}: must be finite and positive, with a finite inverse"),
        ))
    }
}

impl MixedPrecision {
    /// Casts `module`'s float state that is not f32 back to f32. The master model's own
    /// parameters are f32 and untouched by [`cast_module`](Self::cast_module); what it finds
    /// in the compute type is state shared with the compute copy (a `RunningState`), which
    /// the mapper writes back in place, so mapping a clone updates `module` itself. A running
    /// state keeps the forward's update pending until it is synced, and mappers see the
    /// synced value: `valid` (Burn's public way to sync, cheap: it copies tensor handles)
    /// syncs first.
    fn restore_shared_state<B: AutodiffBackend, M: AutodiffModule<B>>(&self, module: &M) {
        if self.compute == Precision::F32 {
            return;
        }
        drop(module.valid());
        let _ = module.clone().map(&mut CastParams(DType::F32));
    }
}

/// A mapper that casts a module's float parameters to a type (mixed precision's compute copy, a
/// model served in `bf16`), keeping each id so that gradients still map to it. One already of
/// the type is left as it is (no node on the autodiff graph).
#[derive(Debug, Clone, Copy)]
pub struct CastParams(pub DType);

impl<B: burn::tensor::backend::Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        if param.val().dtype() == dtype {
            return param;
        }
        param.map(|tensor| tensor.cast(dtype))
    }
}

/// Divides each parameter's gradient by the scale and counts the non-finite entries of the
/// result, on the device: one read for the whole model decides whether to skip.
struct Unscale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    factor: f32,
    non_finite: Option<Tensor<B::InnerBackend, 1, Int>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unscale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let grad = grad.mul_scalar(self.factor);
        let bad = grad.clone().is_finite().bool_not().int().sum();
        self.non_finite = Some(match self.non_finite.take() {
            Some(count) => count + bad,
            None => bad,
        });
        self.grads.register(param.id, grad);
    }
}
