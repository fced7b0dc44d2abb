//! Backend-generic checks of `SkLinear`, instantiated per backend by the `ndarray`, `wgpu`
//! and `cuda` modules.

#![allow(dead_code)]

/// The backend-generic tests for one backend: `backend_suite!(B, Autodiff<B>, device, strategy)`
/// in a backend's module defines one `#[test]` per check below, so that every backend runs the
/// same list.
macro_rules! backend_suite {
    ($b:ty, $ab:ty, $device:expr, $strategy:expr) => {
        #[test]
        fn forward_matches_references() {
            crate::common::forward_matches_references::<$b>(&$device, $strategy);
        }

        #[test]
        fn gradients_match_closed_form() {
            crate::common::gradients_match_closed_form::<$ab>(&$device, $strategy);
        }

        #[test]
        fn init_is_seeded() {
            crate::common::init_is_seeded::<$b>(&$device, $strategy);
        }

        #[test]
        fn optimizer_leaves_sketches_alone() {
            crate::common::optimizer_leaves_sketches_alone::<$ab>(&$device, $strategy);
        }

        #[test]
        fn record_round_trip_is_exact() {
            crate::common::record_round_trip_is_exact::<$b>(&$device, $strategy);
        }

        #[test]
        fn wrong_input_width_panics() {
            crate::common::wrong_input_width_panics::<$b>(&$device, $strategy);
        }

        #[test]
        fn backend_path_matches_tensor_ops() {
            crate::common::backend_path_matches_tensor_ops::<$b>(&$device, $strategy);
        }

        #[test]
        fn fused_activation_trains_like_unfused() {
            crate::common::fused_activation_trains_like_unfused::<$ab>(&$device, $strategy);
        }
    };
}

use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinFileRecorder, FullPrecisionSettings};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor, TensorData};
use burn_sketch::backend::KernelStrategy;
use burn_sketch::{Activation, ActivationExt, SkLinear, SkLinearConfig, SketchBackend};

/// Shapes with odd and prime sizes, a size-1 case and a wide/narrow pair.
pub const SHAPES: [(usize, usize, usize); 4] = [(7, 5, 3), (13, 11, 2), (1, 1, 1), (24, 9, 5)];
pub const TERMS: [usize; 3] = [1, 2, 4];

#[allow(unused_imports)]
pub use crate::close::{TOLERANCE, assert_close, assert_close_within, serial};

/// `y` written term by term, the formula of DESIGN.md with no concatenation trick.
pub fn naive_forward<B: Backend>(layer: &SkLinear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let (t, d_in, d_out, k) = (
        layer.num_terms(),
        layer.d_input(),
        layer.d_output(),
        layer.low_rank(),
    );
    let term = |p: &Tensor<B, 3>, i: usize, rows: usize, cols: usize| {
        p.clone().narrow(0, i, 1).reshape([rows, cols])
    };
    let mut y = Tensor::<B, 2>::zeros([x.dims()[0], d_out], &x.device());
    for i in 0..t {
        let s1 = term(&layer.s1s.val(), i, d_in, k);
        let u1 = term(&layer.u1s.val(), i, k, d_out);
        let u2 = term(&layer.u2s.val(), i, d_in, k);
        let s2 = term(&layer.s2s.val(), i, k, d_out);
        y = y + x.clone().matmul(s1).matmul(u1) + x.clone().matmul(u2).matmul(s2);
    }
    let y = y.div_scalar(2.0 * t as f64);
    match &layer.bias {
        Some(b) => y + b.val().unsqueeze_dim(0),
        None => y,
    }
}

fn dense_forward<B: Backend>(layer: &SkLinear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let y = x.matmul(layer.to_dense_weight());
    match &layer.bias {
        Some(b) => y + b.val().unsqueeze_dim(0),
        None => y,
    }
}

/// Forward equals `x·W_eff + b` and the per-term formula, for every T, odd sizes, with and
/// without bias, and for rank-1, rank-2 and rank-3 inputs.
pub fn forward_matches_references<B: SketchBackend>(device: &B::Device, strategy: KernelStrategy) {
    let _serial = serial();
    B::seed(device, 7);
    for (d_in, d_out, k) in SHAPES {
        for t in TERMS {
            for bias in [true, false] {
                let layer = SkLinearConfig::new(d_in, d_out, t, k)
                    .with_strategy(strategy)
                    .with_bias(bias)
                    .init::<B>(device);
                let what = format!("d_in={d_in} d_out={d_out} k={k} T={t} bias={bias}");

                let x3 = Tensor::<B, 3>::random([2, 3, d_in], Distribution::Default, device);
                let x2 = x3.clone().reshape([6, d_in]);
                let expected = naive_forward(&layer, x2.clone());
                assert_close(
                    dense_forward(&layer, x2.clone()).into_data(),
                    expected.to_data(),
                    &format!("dense weight vs naive, {what}"),
                );
                assert_close(
                    layer.forward(x2.clone()).into_data(),
                    expected.to_data(),
                    &format!("rank-2 forward, {what}"),
                );
                assert_close(
                    layer.forward(x3).reshape([6, d_out]).into_data(),
                    expected.to_data(),
                    &format!("rank-3 forward, {what}"),
                );
                let x1 = x2.clone().narrow(0, 4, 1).reshape([d_in]);
                assert_close(
                    layer.forward(x1).into_data(),
                    expected.narrow(0, 4, 1).reshape([d_out]).into_data(),
                    &format!("rank-1 forward, {what}"),
                );
            }
        }
    }
}

/// The gradients of `L = Σ y ⊙ g` equal DESIGN.md's closed forms; the sketches get none.
pub fn gradients_match_closed_form<B: AutodiffBackend + SketchBackend>(
    device: &B::Device,
    strategy: KernelStrategy,
) {
    let _serial = serial();
    B::seed(device, 11);
    for (d_in, d_out, k) in [(7, 5, 3), (16, 9, 4)] {
        for t in [1, 3] {
            let layer = SkLinearConfig::new(d_in, d_out, t, k)
                .with_strategy(strategy)
                .init::<B>(device);
            let what = format!("d_in={d_in} d_out={d_out} k={k} T={t}");
            let n = 6;
            let x = Tensor::<B, 2>::random([n, d_in], Distribution::Default, device).require_grad();
            let g = Tensor::<B, 2>::random([n, d_out], Distribution::Default, device);
            let loss = (layer.forward(x.clone()) * g.clone()).sum();
            let grads = loss.backward();
            let dx_autodiff = x.grad(&grads).expect("input gradient");

            assert!(
                layer.u1s.grad(&grads).is_none(),
                "U1s got a gradient ({what})"
            );
            assert!(
                layer.u2s.grad(&grads).is_none(),
                "U2s got a gradient ({what})"
            );

            let inner = |t: Tensor<B, 3>| t.inner();
            let (x, g) = (x.inner(), g.inner());
            let gs = g.clone().div_scalar(2.0 * t as f64);
            let (s1s, s2s) = (inner(layer.s1s.val()), inner(layer.s2s.val()));
            let (u1s, u2s) = (inner(layer.u1s.val()), inner(layer.u2s.val()));
            let term = |p: &Tensor<B::InnerBackend, 3>, i: usize, rows: usize, cols: usize| {
                p.clone().narrow(0, i, 1).reshape([rows, cols])
            };

            let mut dx = Tensor::<B::InnerBackend, 2>::zeros([n, d_in], &x.device());
            let mut ds1 = Vec::new();
            let mut ds2 = Vec::new();
            for i in 0..t {
                let s1 = term(&s1s, i, d_in, k);
                let s2 = term(&s2s, i, k, d_out);
                let u1 = term(&u1s, i, k, d_out);
                let u2 = term(&u2s, i, d_in, k);
                let gu1 = gs.clone().matmul(u1.transpose());
                ds1.push(
                    x.clone()
                        .transpose()
                        .matmul(gu1.clone())
                        .unsqueeze_dim::<3>(0),
                );
                ds2.push(
                    x.clone()
                        .matmul(u2.clone())
                        .transpose()
                        .matmul(gs.clone())
                        .unsqueeze_dim::<3>(0),
                );
                dx = dx
                    + gu1.matmul(s1.transpose())
                    + gs.clone().matmul(s2.transpose()).matmul(u2.transpose());
            }
            let grad = |p: Option<_>, name: &str| -> TensorData {
                let p: Tensor<B::InnerBackend, 3> =
                    p.unwrap_or_else(|| panic!("{name} got no gradient ({what})"));
                p.into_data()
            };
            assert_close(
                grad(layer.s1s.grad(&grads), "S1s"),
                Tensor::cat(ds1, 0).into_data(),
                &format!("dS1s, {what}"),
            );
            assert_close(
                grad(layer.s2s.grad(&grads), "S2s"),
                Tensor::cat(ds2, 0).into_data(),
                &format!("dS2s, {what}"),
            );
            let dbias = layer
                .bias
                .as_ref()
                .unwrap()
                .grad(&grads)
                .expect("bias gradient");
            assert_close(
                dbias.into_data(),
                g.sum_dim(0).reshape([d_out]).into_data(),
                &format!("dbias, {what}"),
            );
            assert_close(
                dx_autodiff.into_data(),
                dx.into_data(),
                &format!("dx, {what}"),
            );
        }
    }
}

/// Two initialisations after the same `B::seed` are identical; a different seed differs.
pub fn init_is_seeded<B: SketchBackend>(device: &B::Device, strategy: KernelStrategy) {
    let _serial = serial();
    let config = SkLinearConfig::new(9, 6, 2, 3).with_strategy(strategy);
    let draw = |seed| {
        B::seed(device, seed);
        config.init::<B>(device).to_dense_weight().into_data()
    };
    let (a, b, c) = (draw(5), draw(5), draw(6));
    assert_eq!(a, b, "same seed gave different layers");
    assert_ne!(a, c, "different seeds gave the same layer");
}

/// A training step changes `S1s`, `S2s` and the bias but leaves the fixed sketches
/// bit-for-bit alone.
pub fn optimizer_leaves_sketches_alone<B: AutodiffBackend + SketchBackend>(
    device: &B::Device,
    strategy: KernelStrategy,
) {
    let _serial = serial();
    B::seed(device, 3);
    let layer = SkLinearConfig::new(10, 4, 2, 3)
        .with_strategy(strategy)
        .init::<B>(device);
    let before = layer.clone();
    let x = Tensor::<B, 2>::random([5, 10], Distribution::Default, device);
    let grads = layer.forward(x).powi_scalar(2).mean().backward();
    let grads = GradientsParams::from_grads(grads, &layer);
    let mut optim = AdamConfig::new().init();
    let after = optim.step(0.1, layer, grads);

    assert_eq!(before.u1s.val().into_data(), after.u1s.val().into_data());
    assert_eq!(before.u2s.val().into_data(), after.u2s.val().into_data());
    assert_ne!(before.s1s.val().into_data(), after.s1s.val().into_data());
    assert_ne!(before.s2s.val().into_data(), after.s2s.val().into_data());
    assert!(!after.u1s.is_require_grad() && !after.u2s.is_require_grad());
}

/// Saving with Burn's recorder and loading into a freshly initialised layer restores every
/// tensor bit-for-bit (the sketches included), so outputs are identical.
pub fn record_round_trip_is_exact<B: SketchBackend>(device: &B::Device, strategy: KernelStrategy) {
    let _serial = serial();
    // Sketches recorded whole, then as their seed: loaded into a layer whose own sketches
    // differ, both give back the saved layer exactly.
    for sketch_seed in [None, Some(9)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer");
        let recorder = BinFileRecorder::<FullPrecisionSettings>::new();
        let config = SkLinearConfig::new(11, 7, 3, 2).with_strategy(strategy);
        B::seed(device, 1);
        let layer = config
            .clone()
            .with_sketch_seed(sketch_seed)
            .init::<B>(device);
        assert_eq!(layer.u1s.seed(), sketch_seed.map(|seed| seed * 2));
        layer.clone().save_file(path.clone(), &recorder).unwrap();
        B::seed(device, 2);
        let fresh = config.init::<B>(device);
        assert_ne!(fresh.u1s.val().into_data(), layer.u1s.val().into_data());
        let loaded = fresh.load_file(path, &recorder, device).unwrap();

        for (a, b, name) in [
            (&layer.s1s, &loaded.s1s, "s1s"),
            (&layer.s2s, &loaded.s2s, "s2s"),
            (&layer.u1s, &loaded.u1s, "u1s"),
            (&layer.u2s, &loaded.u2s, "u2s"),
        ] {
            assert_eq!(
                a.val().into_data(),
                b.val().into_data(),
                "{name} changed ({sketch_seed:?})"
            );
        }
        assert!(!loaded.u1s.is_require_grad() && !loaded.u2s.is_require_grad());
        let x = Tensor::<B, 2>::random([4, 11], Distribution::Default, device);
        assert_eq!(
            layer.forward(x.clone()).into_data(),
            loaded.forward(x).into_data()
        );
    }
}

/// An input whose last dimension is not `d_input` panics with a message that says so.
pub fn wrong_input_width_panics<B: SketchBackend>(device: &B::Device, strategy: KernelStrategy) {
    let _serial = serial();
    let layer = SkLinearConfig::new(8, 4, 1, 2)
        .with_strategy(strategy)
        .init::<B>(device);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        layer.forward(Tensor::<B, 2>::zeros([3, 7], device))
    }));
    let message = result.expect_err("a [3, 7] input must be rejected");
    let message = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("d_input = 8"),
        "unhelpful panic: {message}"
    );
}

/// The backend's own `SketchBackend` implementation (on CubeCL backends: the kernels)
/// against the tensor-op path on the same backend, forward and backward, including a rank
/// `2Tk` beyond the fused kernel's limit and odd sizes.
pub fn backend_path_matches_tensor_ops<B: SketchBackend>(
    device: &B::Device,
    strategy: KernelStrategy,
) {
    use burn_sketch::backend::{WantedGradients, tensor_ops};
    let _serial = serial();
    B::seed(device, 5);
    // (rows, d_in, d_out, T, k)
    for (rows, d_in, d_out, t, k) in [
        (1, 3, 2, 1, 1),
        (37, 29, 41, 3, 7),
        (20, 50, 33, 2, 80),
        // Long depths over few rows: the kernels split their products' depth.
        (5, 1100, 700, 1, 16),
        // Enough rows for the CPU paths to split them among threads (an odd count: blocks
        // of unequal size).
        (151, 40, 30, 2, 8),
    ] {
        let what = format!("n={rows} d_in={d_in} d_out={d_out} T={t} k={k}");
        let layer = SkLinearConfig::new(d_in, d_out, t, k)
            .with_strategy(strategy)
            .init::<B>(device);
        let x = Tensor::<B, 2>::random([rows, d_in], Distribution::Default, device);
        let g = Tensor::<B, 2>::random([rows, d_out], Distribution::Default, device);
        let bias = layer.bias.as_ref().map(|b| b.val());

        for activation in ACTIVATIONS {
            let actual = B::sketched_linear(
                x.clone(),
                layer.weights(),
                bias.clone(),
                activation,
                strategy,
            );
            let expected = tensor_ops::sketched_linear(x.clone(), layer.weights(), bias.clone());
            assert_close(
                actual.into_data(),
                activation.apply(expected).into_data(),
                &format!("forward {what} {activation:?}"),
            );
        }

        let actual = B::sketched_linear_backward(
            x.clone(),
            layer.weights(),
            g.clone(),
            WantedGradients::ALL,
            strategy,
        );
        let expected =
            tensor_ops::sketched_linear_backward(x, layer.weights(), g, WantedGradients::ALL);
        let pairs2 = [(actual.x, expected.x, "∂x")];
        for (a, e, name) in pairs2 {
            assert_close(
                a.unwrap().into_data(),
                e.unwrap().into_data(),
                &format!("{name} {what}"),
            );
        }
        let pairs3 = [
            (actual.s1s, expected.s1s, "∂S1s"),
            (actual.s2s, expected.s2s, "∂S2s"),
            (actual.u1s, expected.u1s, "∂U1s"),
            (actual.u2s, expected.u2s, "∂U2s"),
        ];
        for (a, e, name) in pairs3 {
            assert_close(
                a.unwrap().into_data(),
                e.unwrap().into_data(),
                &format!("{name} {what}"),
            );
        }
    }
}

/// Every activation a sketched product can apply.
pub const ACTIVATIONS: [Activation; 3] = [Activation::Identity, Activation::Relu, Activation::Gelu];

/// `forward_activated` against `f(forward(x))` under autodiff, outputs and every gradient
/// (`x`, `S1s`, `S2s`, bias), tracked and untracked: the fused forward keeps what the
/// derivative needs (ReLU's output, GELU's pre-activation) and no more.
pub fn fused_activation_trains_like_unfused<B: AutodiffBackend + SketchBackend>(
    device: &B::Device,
    strategy: KernelStrategy,
) where
    B::InnerBackend: SketchBackend,
{
    let _serial = serial();
    B::seed(device, 17);
    for (rows, d_in, d_out, t, k) in [(9, 13, 7, 2, 3), (1, 5, 4, 1, 1), (33, 20, 70, 1, 8)] {
        let layer = SkLinearConfig::new(d_in, d_out, t, k)
            .with_strategy(strategy)
            .init::<B>(device);
        let x = Tensor::<B, 2>::random([rows, d_in], Distribution::Default, device);
        let g = Tensor::<B, 2>::random([rows, d_out], Distribution::Default, device);
        for activation in ACTIVATIONS {
            let what = format!("n={rows} d_in={d_in} d_out={d_out} T={t} k={k} {activation:?}");
            // `∂y` dense (`y·g`), and a broadcast (the gradient of a plain sum).
            for weighted in [true, false] {
                let run = |fused: bool| {
                    let x = x.clone().require_grad();
                    let y = if fused {
                        layer.forward_activated(x.clone(), activation)
                    } else {
                        activation.apply(layer.forward(x.clone()))
                    };
                    let loss = if weighted {
                        (y.clone() * g.clone()).sum()
                    } else {
                        y.clone().sum()
                    };
                    let grads = loss.backward();
                    let bias = layer.bias.as_ref().expect("a bias");
                    (
                        y.inner().into_data(),
                        [
                            x.grad(&grads).unwrap().into_data(),
                            layer.s1s.grad(&grads).unwrap().into_data(),
                            layer.s2s.grad(&grads).unwrap().into_data(),
                            bias.grad(&grads).unwrap().into_data(),
                        ],
                    )
                };
                let (y_fused, grads_fused) = run(true);
                let (y_plain, grads_plain) = run(false);
                assert_close(y_fused, y_plain.clone(), &format!("y {what}"));
                for (name, (a, e)) in ["∂x", "∂S1s", "∂S2s", "∂bias"]
                    .iter()
                    .zip(grads_fused.into_iter().zip(grads_plain))
                {
                    assert_close(a, e, &format!("{name} {what} weighted={weighted}"));
                }
                // Untracked (inference): the fused forward alone.
                let untracked = layer
                    .valid()
                    .forward_activated(x.clone().inner(), activation);
                assert_close(
                    untracked.into_data(),
                    y_plain,
                    &format!("untracked y {what}"),
                );
            }
        }
    }
}

/// One training step's gradients (`x`, `S1s`, `S2s`, bias) on backend `A` equal those on
/// backend `B` for the same layer, copied across through a record.
pub fn training_step_matches<A, B>(
    device_a: &A::Device,
    device_b: &B::Device,
    strategy: KernelStrategy,
) where
    A: AutodiffBackend + SketchBackend,
    B: AutodiffBackend + SketchBackend,
{
    use burn::record::{BinBytesRecorder, Recorder};
    let _serial = serial();
    A::seed(device_a, 8);
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    for (rows, d_in, d_out, t, k) in [(9, 23, 17, 2, 5), (33, 40, 12, 1, 64)] {
        let what = format!("n={rows} d_in={d_in} d_out={d_out} T={t} k={k}");
        let config = SkLinearConfig::new(d_in, d_out, t, k).with_strategy(strategy);
        let layer_a = config.init::<A>(device_a);
        let bytes = recorder.record(layer_a.clone().into_record(), ()).unwrap();
        let layer_b = config
            .init::<B>(device_b)
            .load_record(recorder.load(bytes, device_b).unwrap());

        let x = Tensor::<A, 2>::random([rows, d_in], Distribution::Default, device_a);
        let g = Tensor::<A, 2>::random([rows, d_out], Distribution::Default, device_a);
        let step_a = {
            let x = x.clone().require_grad();
            let grads = (layer_a.forward(x.clone()) * g.clone()).sum().backward();
            [
                x.grad(&grads).unwrap().into_data(),
                layer_a.s1s.grad(&grads).unwrap().into_data(),
                layer_a.s2s.grad(&grads).unwrap().into_data(),
                layer_a
                    .bias
                    .as_ref()
                    .unwrap()
                    .grad(&grads)
                    .unwrap()
                    .into_data(),
            ]
        };
        let step_b = {
            let x = Tensor::<B, 2>::from_data(x.into_data(), device_b).require_grad();
            let g = Tensor::<B, 2>::from_data(g.into_data(), device_b);
            let grads = (layer_b.forward(x.clone()) * g).sum().backward();
            assert!(
                layer_b.u1s.grad(&grads).is_none(),
                "U1s got a gradient ({what})"
            );
            [
                x.grad(&grads).unwrap().into_data(),
                layer_b.s1s.grad(&grads).unwrap().into_data(),
                layer_b.s2s.grad(&grads).unwrap().into_data(),
                layer_b
                    .bias
                    .as_ref()
                    .unwrap()
                    .grad(&grads)
                    .unwrap()
                    .into_data(),
            ]
        };
        for ((a, b), name) in step_a
            .into_iter()
            .zip(step_b)
            .zip(["∂x", "∂S1s", "∂S2s", "∂bias"])
        {
            assert_close(b, a, &format!("{name} {what}"));
        }
    }
}

/// Panther's PyTorch checkpoints (`tests/data/`, written by `make_pytorch_fixture.py`: the
/// zip format, tensors saved as views, the pre-1.6 format) load onto `B` with exactly the
/// values they hold, and the loaded layer's forward equals the same file's on NdArray.
pub fn panther_checkpoints_match_ndarray<B: SketchBackend>(
    device: &B::Device,
    strategy: KernelStrategy,
) {
    use burn::backend::NdArray;
    use burn_sketch::panther::load_sklinear;

    use crate::bad_input::{expected, fixture};

    let _serial = serial();
    let values = |t: TensorData| t.convert::<f32>().to_vec::<f32>().unwrap();
    let ndarray_device = Default::default();
    // A fixed input, so that the two backends see the same values.
    let x: Vec<f32> = (0..15).map(|i| ((i * 7) % 11) as f32 / 5.0 - 1.0).collect();
    for file in ["sklinear.pt", "sklinear_views.pt", "sklinear_legacy.pt"] {
        let mut layer = load_sklinear::<B>(&fixture(file), "fc.", device)
            .unwrap_or_else(|err| panic!("{file}: {err}"));
        layer.strategy = strategy;
        assert_eq!(
            values(layer.s1s.val().into_data()),
            expected(0, 12),
            "{file}: S1s"
        );
        assert_eq!(
            values(layer.s2s.val().into_data()),
            expected(100, 16),
            "{file}: S2s"
        );
        assert_eq!(
            values(layer.u1s.val().into_data()),
            expected(200, 16),
            "{file}: U1s"
        );
        assert_eq!(
            values(layer.u2s.val().into_data()),
            expected(300, 12),
            "{file}: U2s"
        );
        let bias = layer.bias.as_ref().expect("a bias").val();
        assert_eq!(values(bias.into_data()), expected(400, 4), "{file}: bias");
        assert!(!layer.u1s.is_require_grad() && !layer.u2s.is_require_grad());

        let reference = load_sklinear::<NdArray>(&fixture(file), "fc.", &ndarray_device).unwrap();
        let input = TensorData::new(x.clone(), [5, 3]);
        let expected_y = reference.forward(Tensor::<NdArray, 2>::from_data(
            input.clone(),
            &ndarray_device,
        ));
        let y = layer.forward(Tensor::<B, 2>::from_data(input, device));
        assert_close(
            y.into_data(),
            expected_y.into_data(),
            &format!("{file}: forward"),
        );
    }
}
