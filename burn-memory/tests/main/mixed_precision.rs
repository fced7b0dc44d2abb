//! Mixed-precision checks shared by the backends that compute in half precision (Flex on CPU,
//! wgpu): each backend's module calls them with its own autodiff backend and device.

use burn::module::{AutodiffModule, Module};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, ElementConversion, Tensor, Tolerance};
use burn_memory::{LossScale, MixedPrecisionConfig, Precision, StepOutcome};

/// 40 Adam steps of a linear model towards a fixed random target, forward and backward in
/// `precision`: every step applies, the forward's output has the half-precision dtype, master
/// weights stay f32, and the loss falls below half its first value.
pub fn training_reduces_the_loss<A: AutodiffBackend>(device: &A::Device, precision: Precision) {
    A::seed(device, 3);
    let mut model = LinearConfig::new(16, 4).init::<A>(device);
    let target = LinearConfig::new(16, 4).init::<A>(device);
    let mut optim = AdamConfig::new().init();
    let mut amp = MixedPrecisionConfig::new()
        .with_compute(precision)
        .init::<A>(device)
        .unwrap();
    let x = Tensor::<A, 2>::random([64, 16], Distribution::Default, device);
    let y = target.forward(x.clone()).detach();
    let half = precision.dtype();

    let mut losses = Vec::new();
    for _ in 0..40 {
        let out = amp.cast_module(&model).forward(amp.cast_input(x.clone()));
        assert_eq!(out.dtype(), half, "the forward pass must run in {half:?}");
        let loss = (out.cast(DType::F32) - y.clone()).powi_scalar(2).mean();
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let grads = GradientsParams::from_grads(amp.scale_loss(loss).backward(), &model);
        let outcome;
        (model, outcome) = amp.step(&mut optim, 1e-2, model, grads);
        assert_eq!(outcome, StepOutcome::Applied);
    }
    assert_eq!(
        model.weight.val().dtype(),
        DType::F32,
        "master weights stay f32"
    );
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(
        last < 0.5 * first,
        "{half:?} training did not learn: loss {first} -> {last}"
    );
}

/// A half-precision step whose gradient holds an infinity (injected into the f32 gradient the
/// backward pass returns) is skipped: the weights stay as they were and a dynamic scale halves.
pub fn an_injected_infinity_skips_the_step<A: AutodiffBackend>(
    device: &A::Device,
    precision: Precision,
) {
    A::seed(device, 4);
    let model = LinearConfig::new(8, 3).init::<A>(device);
    let mut amp = MixedPrecisionConfig::new()
        .with_compute(precision)
        .with_loss_scale(LossScale::dynamic())
        .init::<A>(device)
        .unwrap();
    let scale = amp.scale();
    let x = Tensor::<A, 2>::random([16, 8], Distribution::Default, device);
    let loss = amp
        .cast_module(&model)
        .forward(amp.cast_input(x))
        .cast(DType::F32)
        .powi_scalar(2)
        .mean();
    let mut grads = GradientsParams::from_grads(amp.scale_loss(loss).backward(), &model);
    let grad = grads
        .remove::<A::InnerBackend, 2>(model.weight.id)
        .expect("a weight gradient");
    let poisoned = grad.slice_assign([0..1, 0..1], Tensor::from_data([[f32::INFINITY]], device));
    grads.register(model.weight.id, poisoned);

    let before = model.weight.val().into_data();
    let mut optim = SgdConfig::new().init();
    let (after, outcome) = amp.step(&mut optim, 0.5, model, grads);
    assert_eq!(outcome, StepOutcome::Skipped);
    assert_eq!(amp.scale(), scale / 2.0);
    after.weight.val().into_data().assert_eq(&before, true);
}

/// A linear layer and a batch norm: state (the running statistics) beside the parameters.
#[derive(Module, Debug)]
pub struct NormNet<B: Backend> {
    linear: Linear<B>,
    norm: BatchNorm<B>,
}

/// Three half-precision steps of a model with `BatchNorm`: its running statistics, which Burn
/// shares between the master model and the compute copy, stay f32 in the master and hold the
/// running mean of the batches the compute copy saw; the master's inference then runs in f32.
pub fn batch_norm_statistics_stay_f32<A: AutodiffBackend>(
    device: &A::Device,
    precision: Precision,
) {
    A::seed(device, 5);
    let mut model = NormNet {
        linear: LinearConfig::new(8, 4).init::<A>(device),
        norm: BatchNormConfig::new(4).init::<A>(device),
    };
    // A static scale of 1: the test is about the statistics, not about overflow skips.
    let mut amp = MixedPrecisionConfig::new()
        .with_compute(precision)
        .with_loss_scale(LossScale::Static(1.0))
        .init::<A>(device)
        .unwrap();
    let mut optim = SgdConfig::new().init();
    let x = Tensor::<A, 2>::random([32, 8], Distribution::Normal(2.0, 1.0), device);
    let mut expected = Tensor::<A::InnerBackend, 1>::zeros([4], device);
    for _ in 0..3 {
        let compute = amp.cast_module(&model);
        let hidden = compute.linear.forward(amp.cast_input(x.clone()));
        let batch_mean = hidden
            .clone()
            .inner()
            .cast(DType::F32)
            .mean_dim(0)
            .reshape([4]);
        expected = expected.mul_scalar(0.9) + batch_mean.mul_scalar(0.1);
        let out = compute.norm.forward(hidden);
        assert_eq!(
            out.dtype(),
            precision.dtype(),
            "the forward runs in the compute type"
        );
        let loss = out.cast(DType::F32).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(amp.scale_loss(loss).backward(), &model);
        let outcome;
        (model, outcome) = amp.step(&mut optim, 1e-2, model, grads);
        assert_eq!(outcome, StepOutcome::Applied);
        assert_eq!(
            model.norm.running_mean.value().dtype(),
            DType::F32,
            "the master's running mean was left in {:?}",
            precision.dtype()
        );
    }
    let running_mean = model.norm.running_mean.value().inner();
    running_mean
        .into_data()
        .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::rel_abs(2e-2, 2e-2));
    assert_eq!(model.norm.running_var.value().dtype(), DType::F32);
    let valid = model.valid();
    let y = valid.norm.forward(valid.linear.forward(x.inner()));
    assert_eq!(y.dtype(), DType::F32);
    let finite: bool = y.is_finite().all().into_scalar().elem();
    assert!(finite, "the master's f32 inference is not finite");
}
