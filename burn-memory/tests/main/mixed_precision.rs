//! Mixed-precision checks shared by the backends that compute in half precision (Flex on CPU,
//! wgpu): each backend's module calls them with its own autodiff backend and device.

use burn::nn::LinearConfig;
use burn::optim::{AdamConfig, GradientsParams, SgdConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Distribution, ElementConversion, Tensor};
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
