//! Adam and AdamW with each parameter's update one fused call.
//!
//! Burn's [`Adam`] updates a parameter with about ten tensor operations (the moments'
//! `mul_scalar`s and `add`s, the square, the square root, the division, the learning rate,
//! the subtraction, and the weight decay's two), each a full pass over the parameter and
//! most a new buffer. [`FusedAdam`] computes the same update, with the same roundings, in
//! one [`FusedBackend::fused_adam_step`] call: on FastFlex one pass over the parameter, its
//! gradient and its two moments, written in place where no other tensor holds their
//! buffers; on every other backend the composition of Burn's operations
//! ([`composed::adam_step`](crate::composed::adam_step)).
//!
//! [`FusedAdamConfig`] has [`AdamConfig`]'s fields and defaults, and its state is Burn's own
//! [`AdamState`] record, so `FusedAdamConfig::new().init::<B, M>()` replaces
//! `AdamConfig::new().init()`.
//! [`FusedAdamWConfig`] is the same for [`AdamW`].
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::module::Module;
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::{GradientsParams, Optimizer};
//! use burn::tensor::{Distribution, Tensor};
//! use burn_fused::optim::FusedAdamConfig;
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let model: Linear<B> = LinearConfig::new(4, 2).init(&device);
//! let mut optim = FusedAdamConfig::new().init::<B, Linear<B>>();
//! let x = Tensor::<B, 2>::random([3, 4], Distribution::Default, &device);
//! let grads = GradientsParams::from_grads(model.forward(x).sum().backward(), &model);
//! let model = optim.step(1e-3, model, grads);
//! assert_eq!(model.weight.dims(), [4, 2]);
//! ```

use burn::config::Config;
use burn::grad_clipping::GradientClippingConfig;
use burn::module::AutodiffModule;
use burn::optim::LearningRate;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{
    Adam, AdamConfig, AdamState, AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState,
    SimpleOptimizer,
};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::FusedBackend;

/// The scalars of one Adam or AdamW step ([`FusedBackend::fused_adam_step`]).
///
/// With `g` the gradient, `t` = `time`, and every operation rounded in the tensors' float
/// type as Burn 0.21 rounds it:
///
/// - Adam (`decoupled_weight_decay` false): `g ← param·weight_decay + g` (L2 penalty,
///   where `weight_decay` is set); `m ← m·β₁ + g·(1−β₁)`; `v ← v·β₂ + g²·(1−β₂)`;
///   `c = √(1−β₂ᵗ)`; `param ← param − (m·(c/(1−β₁ᵗ)) / (√v + ε·c))·lr`: the bias
///   corrections folded into one factor and `ε` added to `√v` scaled by `c` (so
///   `ε` is added to `√v̂`).
/// - AdamW (`decoupled_weight_decay` true): the same moments of the raw gradient;
///   `param ← param·(1 − lr·weight_decay) − ((m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + ε))·lr`
///   (no decay factor when `lr·weight_decay` is 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// The learning rate (Burn's `LearningRate`, rounded to the tensors' type).
    pub lr: f64,
    /// The first moment's decay rate `β₁`.
    pub beta_1: f32,
    /// The second moment's decay rate `β₂`.
    pub beta_2: f32,
    /// Added to the square root of the bias-corrected second moment.
    pub epsilon: f32,
    /// Adam's L2 penalty or AdamW's decoupled decay rate; `None` for neither.
    pub weight_decay: Option<f32>,
    /// AdamW's formulas (decoupled decay) rather than Adam's.
    pub decoupled_weight_decay: bool,
    /// The step's number, from 1: the moments given are those after step `time − 1`.
    pub time: usize,
}

/// [`FusedAdam`]'s configuration: [`AdamConfig`]'s fields, with its defaults.
#[derive(Config, Debug)]
pub struct FusedAdamConfig {
    /// `β₁`.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// `β₂`.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// A value required for numerical stability.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// AMSGrad (not fused: that step is Burn's [`Adam`]'s).
    #[config(default = false)]
    pub amsgrad: bool,
    /// The L2 penalty added to the gradient ([`WeightDecayConfig`]).
    pub weight_decay: Option<WeightDecayConfig>,
    /// Gradient clipping, applied by the [`OptimizerAdaptor`] before the step.
    pub grad_clipping: Option<GradientClippingConfig>,
}

/// Burn's [`Adam`] with each parameter's step one [`FusedBackend::fused_adam_step`] call.
#[derive(Clone)]
pub struct FusedAdam {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: Option<f32>,
    /// Burn's own, for AMSGrad.
    amsgrad: Option<Adam>,
}

impl FusedAdamConfig {
    /// The optimizer itself.
    pub fn build(&self) -> FusedAdam {
        let amsgrad = self.amsgrad.then(|| {
            AdamConfig::new()
                .with_beta_1(self.beta_1)
                .with_beta_2(self.beta_2)
                .with_epsilon(self.epsilon)
                .with_amsgrad(true)
                .with_weight_decay(self.weight_decay.clone())
                .build()
        });
        FusedAdam {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay.as_ref().map(|w| w.penalty),
            amsgrad,
        }
    }

    /// The optimizer for a module `M` on `B`, as [`AdamConfig::init`].
    pub fn init<B, M>(&self) -> OptimizerAdaptor<FusedAdam, M, B>
    where
        B: AutodiffBackend,
        B::InnerBackend: FusedBackend,
        M: AutodiffModule<B>,
    {
        let mut optim = OptimizerAdaptor::from(self.build());
        if let Some(config) = &self.grad_clipping {
            optim = optim.with_grad_clipping(config.init());
        }
        optim
    }
}

/// One fused step on a parameter of any rank and its Burn momentum state.
fn fused_step<B: FusedBackend, const D: usize>(
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    state: Option<AdaptiveMomentumState<B, D>>,
    step: impl FnOnce(usize) -> AdamStep,
) -> (Tensor<B, D>, AdaptiveMomentumState<B, D>) {
    let shape = tensor.shape();
    let n = shape.num_elements();
    let grad = grad.reshape([n]);
    let (time, moment_1, moment_2) = match state {
        Some(state) => (
            state.time + 1,
            state.moment_1.reshape([n]),
            state.moment_2.reshape([n]),
        ),
        None => (1, grad.zeros_like(), grad.zeros_like()),
    };
    let step = step(time);
    let [param, moment_1, moment_2] =
        B::fused_adam_step(tensor.reshape([n]), grad, moment_1, moment_2, step);
    let state = AdaptiveMomentumState::new(
        time,
        moment_1.reshape(shape.clone()),
        moment_2.reshape(shape.clone()),
    );
    (param.reshape(shape), state)
}

impl<B: FusedBackend> SimpleOptimizer<B> for FusedAdam {
    type State<const D: usize> = AdamState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        if let Some(adam) = &self.amsgrad {
            return SimpleOptimizer::<B>::step(adam, lr, tensor, grad, state);
        }
        let step = |time| AdamStep {
            lr,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            decoupled_weight_decay: false,
            time,
        };
        let (tensor, momentum) = fused_step(tensor, grad, state.map(|s| s.momentum), step);
        (tensor, Some(AdamState::new(momentum)))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

/// [`FusedAdamW`]'s configuration: [`AdamWConfig`]'s fields, with its defaults.
#[derive(Config, Debug)]
pub struct FusedAdamWConfig {
    /// `β₁`.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// `β₂`.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// A value required for numerical stability.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// The decoupled weight decay rate.
    #[config(default = 1e-4)]
    pub weight_decay: f32,
    /// Cautious weight decay (not fused: that step is Burn's [`AdamW`]'s).
    #[config(default = false)]
    pub cautious_weight_decay: bool,
    /// AMSGrad (not fused: that step is Burn's [`AdamW`]'s).
    #[config(default = false)]
    pub amsgrad: bool,
    /// Gradient clipping, applied by the [`OptimizerAdaptor`] before the step.
    pub grad_clipping: Option<GradientClippingConfig>,
}

/// Burn's [`AdamW`] with each parameter's step one [`FusedBackend::fused_adam_step`] call.
#[derive(Clone)]
pub struct FusedAdamW {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
    /// Burn's own, for AMSGrad and cautious weight decay.
    reference: Option<AdamW>,
}

impl FusedAdamWConfig {
    /// The optimizer itself.
    pub fn build(&self) -> FusedAdamW {
        let reference = (self.amsgrad || self.cautious_weight_decay).then(|| {
            AdamWConfig::new()
                .with_beta_1(self.beta_1)
                .with_beta_2(self.beta_2)
                .with_epsilon(self.epsilon)
                .with_weight_decay(self.weight_decay)
                .with_cautious_weight_decay(self.cautious_weight_decay)
                .with_amsgrad(self.amsgrad)
                .build()
        });
        FusedAdamW {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            reference,
        }
    }

    /// The optimizer for a module `M` on `B`, as [`AdamWConfig::init`].
    pub fn init<B, M>(&self) -> OptimizerAdaptor<FusedAdamW, M, B>
    where
        B: AutodiffBackend,
        B::InnerBackend: FusedBackend,
        M: AutodiffModule<B>,
    {
        let mut optim = OptimizerAdaptor::from(self.build());
        if let Some(config) = &self.grad_clipping {
            optim = optim.with_grad_clipping(config.init());
        }
        optim
    }
}

impl<B: FusedBackend> SimpleOptimizer<B> for FusedAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        if let Some(adamw) = &self.reference {
            return SimpleOptimizer::<B>::step(adamw, lr, tensor, grad, state);
        }
        let step = |time| AdamStep {
            lr,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: Some(self.weight_decay),
            decoupled_weight_decay: true,
            time,
        };
        let (tensor, momentum) = fused_step(tensor, grad, state.map(|s| s.momentum), step);
        (tensor, Some(AdamWState::new(momentum)))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}
