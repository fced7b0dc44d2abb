//! `SkLinear` under burn-memory's profiling backend: one recorded operation per product,
//! running the inner backend's own path, with the gradients of the unprofiled backend.

use burn::backend::{Autodiff, NdArray};
use burn::module::Param;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor, TensorData, Tolerance};
use burn_memory::profile::{Profile, Profiled, Profiler, ProfilerConfig};
use burn_sketch::{SkLinear, SkLinearConfig, SketchBackend};

/// The layer's tensors and the input, drawn once. Seeding each backend would not make two
/// draws equal: the random generator is shared with the tests running beside this one.
struct Fixture {
    factors: [TensorData; 4],
    bias: TensorData,
    x: TensorData,
}

fn fixture() -> Fixture {
    let device = Default::default();
    let layer = SkLinearConfig::new(24, 10, 2, 4).init::<NdArray>(&device);
    Fixture {
        factors: [&layer.s1s, &layer.s2s, &layer.u1s, &layer.u2s].map(|p| p.val().into_data()),
        bias: layer.bias.as_ref().expect("a bias").val().into_data(),
        x: Tensor::<NdArray, 2>::random([6, 24], Distribution::Default, &device).into_data(),
    }
}

/// One training step of the fixture's layer on `B`; with `profile`, only the step is recorded
/// (not the construction).
fn step<B: AutodiffBackend + SketchBackend>(
    fixture: &Fixture,
    profile: bool,
) -> ([TensorData; 2], Profile) {
    let device = Default::default();
    let config = SkLinearConfig::new(24, 10, 2, 4);
    let factor = |index: usize, trainable: bool| {
        let tensor = Tensor::<B, 3>::from_data(fixture.factors[index].clone(), &device);
        Param::from_tensor(tensor).set_require_grad(trainable)
    };
    let layer = SkLinear {
        s1s: factor(0, true),
        s2s: factor(1, true),
        u1s: factor(2, false),
        u2s: factor(3, false),
        bias: Some(Param::from_tensor(Tensor::from_data(
            fixture.bias.clone(),
            &device,
        ))),
        ..config.init::<B>(&device)
    };
    let x = Tensor::<B, 2>::from_data(fixture.x.clone(), &device).require_grad();
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
    let fixture = fixture();
    let (plain, _) = step::<Autodiff<NdArray>>(&fixture, false);
    let (profiled, profile) = step::<Autodiff<Profiled<NdArray>>>(&fixture, true);
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
