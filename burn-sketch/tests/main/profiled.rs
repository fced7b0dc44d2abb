//! `SkLinear` under burn-memory's profiling backend: one recorded operation per product,
//! running the inner backend's own path, with the gradients of the unprofiled backend.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor, TensorData, Tolerance};
use burn_memory::profile::{Profile, Profiled, Profiler, ProfilerConfig};
use burn_sketch::{SkLinearConfig, SketchBackend};

/// One training step of a sketched layer; with `profile`, only the step is recorded (not the
/// initialisation).
fn step<B: AutodiffBackend + SketchBackend>(profile: bool) -> ([TensorData; 2], Profile) {
    let device = Default::default();
    B::seed(&device, 11);
    let layer = SkLinearConfig::new(24, 10, 2, 4).init::<B>(&device);
    let x = Tensor::<B, 2>::random([6, 24], Distribution::Default, &device).require_grad();
    let profiler =
        profile.then(|| Profiler::start(ProfilerConfig::new().with_record_shapes(true)).unwrap());
    let grads = layer.forward(x.clone()).powi_scalar(2).sum().backward();
    let recorded = profiler.map(Profiler::stop).unwrap_or_default();
    let grads = [
        x.grad(&grads).unwrap().into_data(),
        layer.s1s.grad(&grads).unwrap().into_data(),
    ];
    (grads, recorded)
}

#[test]
fn sketched_products_are_recorded_once_with_the_inner_gradients() {
    let (plain, _) = step::<Autodiff<NdArray>>(false);
    let (profiled, profile) = step::<Autodiff<Profiled<NdArray>>>(true);
    for (plain, profiled) in plain.iter().zip(&profiled) {
        plain.assert_approx_eq::<f32>(profiled, Tolerance::absolute(0.0));
    }
    let table = profile.key_averages();
    assert_eq!(table.row("sketched_linear").unwrap().calls, 1, "{table}");
    assert_eq!(
        table.row("sketched_linear_backward").unwrap().calls,
        1,
        "{table}"
    );
    // The product ran NdArray's own path, not the tensor-op composition: no matmul.
    assert!(table.row("float_matmul").is_none(), "{table}");
    let forward = profile
        .ops
        .iter()
        .find(|op| op.name == "sketched_linear")
        .unwrap();
    assert_eq!(forward.inputs[0].shape, vec![6, 24]);
    assert_eq!(forward.outputs[0].shape, vec![6, 10]);
}
