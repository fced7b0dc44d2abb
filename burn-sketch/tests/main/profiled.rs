//! `SkLinear` under burn-profiler's profiling backend: one recorded operation per product,
//! running the inner backend's own path, with the gradients of the unprofiled backend.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Param;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor, TensorData, Tolerance};
use burn_profiler::{Profile, Profiled, Profiler, ProfilerConfig};
use burn_sketch::{Activation, SkLinear, SkLinearConfig, SketchBackend};

/// One profiler at a time: the tests of this module each start one.
fn one_profiler() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

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
    activation: Activation,
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
        u1s: factor(2, false).into(),
        u2s: factor(3, false).into(),
        bias: Some(Param::from_tensor(Tensor::from_data(
            fixture.bias.clone(),
            &device,
        ))),
        ..config.init::<B>(&device)
    };
    let x = Tensor::<B, 2>::from_data(fixture.x.clone(), &device).require_grad();
    let profiler =
        profile.then(|| Profiler::start(ProfilerConfig::new().with_record_shapes(true)).unwrap());
    let y = layer.forward_activated(x.clone(), activation);
    let grads = y.powi_scalar(2).sum().backward();
    let recorded = profiler.map(Profiler::stop).unwrap_or_default();
    let grads = [
        x.grad(&grads).unwrap().into_data(),
        layer.s1s.grad(&grads).unwrap().into_data(),
    ];
    (grads, recorded)
}

#[test]
fn sketched_products_are_recorded_once_with_the_inner_gradients() {
    let _one = one_profiler();
    let fixture = fixture();
    let identity = Activation::Identity;
    let (plain, _) = step::<Autodiff<NdArray>>(&fixture, false, identity);
    let (profiled, profile) = step::<Autodiff<Profiled<NdArray>>>(&fixture, true, identity);
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

/// A tracked GELU layer keeps its pre-activation and applies the activation through
/// `SketchBackend::activate`: under the profiler that is still the inner backend's (Flex's
/// vectorised loop, not Burn's `gelu`), so the profiled step computes the same values, bit for
/// bit, and records the activation and its backward once each.
#[test]
fn activations_run_the_inner_backends_own_and_are_recorded() {
    let _one = one_profiler();
    let fixture = fixture();
    let gelu = Activation::Gelu;
    let (plain, _) = step::<Autodiff<Flex>>(&fixture, false, gelu);
    let (profiled, profile) = step::<Autodiff<Profiled<Flex>>>(&fixture, true, gelu);
    for (plain, profiled) in plain.iter().zip(&profiled) {
        plain.assert_approx_eq::<f32>(profiled, Tolerance::absolute(0.0));
    }
    let table = profile.key_averages();
    assert_eq!(table.row("activate").unwrap().calls, 1, "{table}");
    assert_eq!(
        table.row("activation_backward").unwrap().calls,
        1,
        "{table}"
    );
    assert!(table.row("gelu").is_none(), "{table}");
}
