//! The operations `FastFlex` computes itself (`linear`, activations, normalisation,
//! attention) against Flex's own results in every float type, on odd shapes and on strided,
//! permuted and broadcast inputs, forward and backward.

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{LayerNormConfig, LinearConfig};
use burn::tensor::activation::gelu;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor, TensorData};
use burn_fast_cpu::FastFlex;
use burn_memory::draw_params;

use super::{Cast, DEVICE, values};
use crate::close::{assert_close_within, serial};

/// The same `f32` values on both backends.
fn both<const D: usize>(shape: [usize; D], seed: u64) -> (Tensor<FastFlex, D>, Tensor<Flex, D>) {
    let data = TensorData::new(values(shape.iter().product(), seed), shape);
    (
        Tensor::from_data(data.clone(), &DEVICE),
        Tensor::from_data(data, &DEVICE),
    )
}

/// `got` within `tolerance` of `want`, relative to `want`'s largest value.
fn close<const D: usize>(
    got: Tensor<FastFlex, D>,
    want: Tensor<Flex, D>,
    tolerance: f32,
    what: &str,
) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_close_within(got.into_data(), want.into_data(), tolerance, what);
}

/// `linear` at ranks 1 to 4, with and without bias, on inputs whose leading dimensions
/// collapse into one stride (contiguous, sliced) and inputs that do not (permuted), and on a
/// transposed weight: Flex's batched product within `f32` rounding of sums.
#[test]
fn linear_matches_flex_at_every_rank_and_layout() {
    use burn::tensor::module::linear;
    let (w, w32) = both([37, 19], 1);
    let (b, b32) = both([19], 2);
    let (wt, wt32) = both([19, 37], 3);
    let (wt, wt32) = (wt.transpose(), wt32.transpose());
    let (x1, x1_32) = both([37], 4);
    close(
        linear(x1.clone(), w.clone(), Some(b.clone())),
        linear(x1_32, w32.clone(), Some(b32.clone())),
        1e-5,
        "rank 1",
    );
    let (x2, x2_32) = both([5, 37], 5);
    close(
        linear(x2.clone(), w.clone(), None),
        linear(x2_32.clone(), w32.clone(), None),
        1e-5,
        "rank 2",
    );
    close(
        linear(x2, wt.clone(), Some(b.clone())),
        linear(x2_32, wt32.clone(), Some(b32.clone())),
        1e-5,
        "transposed weight",
    );
    let (x3, x3_32) = both([3, 7, 37], 6);
    close(
        linear(x3.clone(), w.clone(), Some(b.clone())),
        linear(x3_32.clone(), w32.clone(), Some(b32.clone())),
        1e-5,
        "rank 3",
    );
    // [7, 3, 37] seen as [3, 7, 37]: the two leading dimensions do not collapse.
    let (p, p32) = both([7, 3, 37], 7);
    close(
        linear(p.swap_dims(0, 1), w.clone(), Some(b.clone())),
        linear(p32.swap_dims(0, 1), w32.clone(), Some(b32.clone())),
        1e-5,
        "permuted leading dimensions",
    );
    // Rows of a wider tensor: a row stride larger than the width.
    close(
        linear(x3.clone().slice([0..3, 1..6, 0..37]), w.clone(), None),
        linear(x3_32.clone().slice([0..3, 1..6, 0..37]), w32.clone(), None),
        1e-5,
        "sliced rows",
    );
    // The feature dimension read with a stride (the input transposed in its last two).
    let (xt, xt32) = both([2, 37, 6], 8);
    close(
        linear(xt.swap_dims(1, 2), w.clone(), Some(b.clone())),
        linear(xt32.swap_dims(1, 2), w32.clone(), Some(b32.clone())),
        1e-5,
        "strided features",
    );
    // A broadcast input: one sequence expanded over a batch of 4.
    let (e, e32) = both([1, 6, 37], 9);
    close(
        linear(e.expand([4, 6, 37]), w.clone(), Some(b.clone())),
        linear(e32.expand([4, 6, 37]), w32.clone(), Some(b32.clone())),
        1e-5,
        "expanded batch",
    );
    let (x4, x4_32) = both([2, 3, 4, 37], 10);
    close(
        linear(x4, w.clone(), Some(b.clone())),
        linear(x4_32, w32.clone(), Some(b32.clone())),
        1e-5,
        "rank 4",
    );
    // More rows than `gemm` takes for `linear` (64): the `sgemm` path, bias in its store.
    let (big, big32) = both([5, 20, 37], 11);
    close(
        linear(big.clone(), w.clone(), Some(b.clone())),
        linear(big32.clone(), w32.clone(), Some(b32.clone())),
        1e-5,
        "100 rows",
    );
    close(
        linear(big.swap_dims(0, 1), wt.clone(), None),
        linear(big32.swap_dims(0, 1), wt32.clone(), None),
        1e-5,
        "100 permuted rows, transposed weight",
    );
    // Empty batch.
    let empty = Tensor::<FastFlex, 3>::zeros([0, 4, 37], &DEVICE);
    assert_eq!(linear(empty, w, Some(b)).dims(), [0, 4, 19]);
}

/// A weight's kept form (its packed panels, a strided weight's contiguous copy) gives,
/// at every path (`gemm` below 8 rows, the packed panels up to 64, `sgemm` past), on the
/// first call and the next, bit for bit what the same weight stored contiguous gives; and a
/// changed weight (written in place, an optimizer step, `load_record`) is never served
/// from the old one's form.
#[test]
fn kept_weight_forms_are_exact_and_never_stale() {
    use burn::tensor::module::linear;
    let _serial = serial();
    for dtype in [DType::F32, DType::BF16] {
        let cast = |t: Tensor<FastFlex, 2>| t.cast(dtype);
        // The same values stored four ways: contiguous, a transposed view, rows of a wider
        // buffer (a row stride past the width), a transposed view of such a slice.
        let (w32, _) = both([37, 45], 20);
        let w = cast(w32.clone());
        let stored_t = cast(Tensor::<FastFlex, 2>::from_data(
            w32.clone().transpose().into_data(),
            &DEVICE,
        ));
        let wide = cast(
            Tensor::<FastFlex, 2>::zeros([37, 50], &DEVICE)
                .slice_assign([0..37, 3..48], w32.clone()),
        );
        let wide_t = cast(
            Tensor::<FastFlex, 2>::zeros([52, 37], &DEVICE)
                .slice_assign([5..50, 0..37], w32.clone().transpose()),
        );
        let layouts = [
            ("transposed", stored_t.transpose()),
            ("sliced rows", wide.slice([0..37, 3..48])),
            (
                "sliced, transposed",
                wide_t.slice([5..50, 0..37]).transpose(),
            ),
        ];
        let (b, _) = both([45], 21);
        let b = b.cast(dtype);
        for rows in [1, 7, 8, 16, 64, 65, 130] {
            let (x, _) = both([rows, 37], 22 + rows as u64);
            let x = cast(x);
            let want = linear(x.clone(), w.clone(), Some(b.clone())).into_data();
            let again = linear(x.clone(), w.clone(), Some(b.clone())).into_data();
            assert_eq!(
                want, again,
                "{dtype:?}, {rows} rows: contiguous, second call"
            );
            for (name, weight) in &layouts {
                for call in ["first", "second"] {
                    let got = linear(x.clone(), weight.clone(), Some(b.clone())).into_data();
                    assert_eq!(
                        got, want,
                        "{dtype:?}, {rows} rows, {name} weight, {call} call"
                    );
                }
            }
        }
    }

    // Written in place: Flex's copy-on-write moves the values, the next call sees them.
    let (w, w32) = both([37, 19], 30);
    let (x, x32) = both([16, 37], 31);
    let _ = linear(x.clone(), w.clone(), None);
    let w = w.add_scalar(1.0);
    let w32 = w32.add_scalar(1.0);
    close(
        linear(x.clone(), w, None),
        linear(x32.clone(), w32, None),
        1e-5,
        "after add_scalar",
    );

    // An optimizer step, then `load_record`, on a model whose weight is transposed.
    use burn::module::Param;
    use burn::optim::{GradientsParams, Optimizer, SgdConfig};
    type AB = Autodiff<FastFlex>;
    let device = DEVICE;
    let mut layer = LinearConfig::new(37, 19).init::<AB>(&device);
    draw_params(&layer);
    let stored = Tensor::<AB, 2>::from_data(layer.weight.val().transpose().into_data(), &device);
    layer.weight = Param::from_tensor(stored.transpose());
    let x16 = Tensor::<AB, 2>::from_data(x.clone().into_data(), &device);
    let flex_of = |layer: &burn::nn::Linear<AB>| {
        let flex = LinearConfig::new(37, 19).init::<Flex>(&device);
        let flex = flex.load_record(burn::nn::LinearRecord {
            weight: Param::from_data(layer.weight.val().into_data(), &device),
            bias: layer
                .bias
                .as_ref()
                .map(|b| Param::from_data(b.val().into_data(), &device)),
        });
        flex.forward(x32.clone())
    };
    use burn::module::AutodiffModule;
    let inference = |layer: &burn::nn::Linear<AB>| layer.valid().forward(x.clone());
    close(inference(&layer), flex_of(&layer), 1e-5, "before the step");
    let y_before = inference(&layer).into_data();
    let loss = layer.forward(x16.clone()).powi_scalar(2).sum();
    let grads = GradientsParams::from_grads(loss.backward(), &layer);
    let mut sgd = SgdConfig::new().init();
    let layer = sgd.step(0.5, layer, grads);
    close(
        inference(&layer),
        flex_of(&layer),
        1e-5,
        "after an optimizer step",
    );
    assert_ne!(
        inference(&layer).into_data(),
        y_before,
        "the step changed the output"
    );
    let other = LinearConfig::new(37, 19).init::<AB>(&device);
    draw_params(&other);
    let layer = layer.load_record(other.clone().into_record());
    close(
        inference(&layer),
        flex_of(&other),
        1e-5,
        "after load_record",
    );
}

/// Several threads multiplying by one shared weight (its form made once, then read by all)
/// and each by weights of its own, made and dropped at every call: each result as alone.
#[test]
fn kept_weight_forms_from_several_threads() {
    use burn::tensor::module::linear;
    let (shared, _) = both([64, 96], 40);
    let (x, _) = both([16, 64], 41);
    let alone = linear(x.clone(), shared.clone(), None).into_data();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (shared, x, alone) = (shared.clone(), x.clone(), alone.clone());
                scope.spawn(move || {
                    for i in 0..20u64 {
                        let got = linear(x.clone(), shared.clone(), None).into_data();
                        assert_eq!(got, alone, "thread {t}, call {i}: shared weight");
                        let (own, own32) = both([64, 96], 100 + t * 20 + i);
                        // Held past the call, as a model holds its weights: its form is kept
                        // until `own` is dropped at the end of the iteration.
                        let x32 = Tensor::<Flex, 2>::from_data(x.clone().into_data(), &DEVICE);
                        close(
                            linear(x.clone(), own.clone(), None),
                            linear(x32, own32, None),
                            1e-5,
                            "own weight",
                        );
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
    });
}

/// `bf16` and `f16` `linear`: within the output's rounding of the `f64` product of the same
/// values (what an `f32` accumulation rounded once gives).
#[test]
fn half_linear_matches_f64() {
    use burn::tensor::module::linear;
    for dtype in [DType::BF16, DType::F16] {
        let (x, x32) = super::pair([3, 11, 70], 40, dtype);
        let (w, w32) = super::pair([70, 33], 41, dtype);
        let (b, b32) = super::pair([33], 42, dtype);
        let got = linear(x, w, Some(b));
        assert_eq!((got.dims(), got.dtype()), ([3, 11, 33], dtype));
        let want = linear(
            x32.cast(DType::F64),
            w32.cast(DType::F64),
            Some(b32.cast(DType::F64)),
        );
        let bits = if dtype == DType::BF16 { -8 } else { -11 };
        let got = got.into_data().convert::<f64>();
        for (g, w) in got.iter::<f64>().zip(want.into_data().iter::<f64>()) {
            assert!(
                (g - w).abs() <= w.abs() * 2f64.powi(bits) + 1e-5,
                "{dtype:?}: {g} against {w}"
            );
        }
    }
}

/// A two-layer model under autodiff on rank-3 input with a padded batch: `FastFlex`'s
/// forward and the gradients of every parameter and of the input agree with Flex's; this
/// reaches `linear`'s three backward products and GELU's backward.
#[test]
fn linear_and_gelu_train_like_flex() {
    let _serial = serial();
    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        up: burn::nn::Linear<B>,
        down: burn::nn::Linear<B>,
        norm: burn::nn::LayerNorm<B>,
    }
    fn run<B: burn::tensor::backend::AutodiffBackend>() -> Vec<Vec<f32>> {
        B::seed(&Default::default(), 5);
        let device = Default::default();
        let net = Net::<B> {
            up: LinearConfig::new(24, 40).init(&device),
            down: LinearConfig::new(40, 24).with_bias(false).init(&device),
            norm: LayerNormConfig::new(24).init(&device),
        };
        draw_params(&net);
        let x = Tensor::<B, 3>::random([3, 5, 24], Distribution::Default, &device).require_grad();
        let h = gelu(net.up.forward(x.clone()));
        let y = net.norm.forward(net.down.forward(h) + x.clone());
        let loss = (y.clone() * y.clone().sin()).sum();
        let grads = loss.backward();
        let f =
            |t: Tensor<B::InnerBackend, 1>| t.into_data().convert::<f32>().to_vec::<f32>().unwrap();
        vec![
            f(y.inner().flatten(0, 2)),
            f(x.grad(&grads).unwrap().flatten(0, 2)),
            f(net.up.weight.grad(&grads).unwrap().flatten(0, 1)),
            f(net.up.bias.as_ref().unwrap().grad(&grads).unwrap()),
            f(net.down.weight.grad(&grads).unwrap().flatten(0, 1)),
            f(net.norm.gamma.grad(&grads).unwrap()),
        ]
    }
    let ours = run::<Autodiff<FastFlex>>();
    let flex = run::<Autodiff<Flex>>();
    let names = [
        "y",
        "∂x",
        "∂up.weight",
        "∂up.bias",
        "∂down.weight",
        "∂norm.gamma",
    ];
    for ((got, want), name) in ours.into_iter().zip(flex).zip(names) {
        let n = got.len();
        assert_close_within(
            TensorData::new(got, [n]),
            TensorData::new(want, [n]),
            1e-4,
            name,
        );
    }
}

/// The same model in `bf16` takes FastFlex's kernels (not Flex's `f64` copies): its
/// gradients within `bf16` precision of the `f32` ones.
#[test]
fn bf16_training_follows_f32() {
    let _serial = serial();
    type AB = Autodiff<FastFlex>;
    <AB as Backend>::seed(&DEVICE, 9);
    let up = LinearConfig::new(32, 48).init::<AB>(&DEVICE);
    draw_params(&up);
    let x = Tensor::<AB, 3>::random([2, 9, 32], Distribution::Default, &DEVICE);
    let run = |dtype: DType| {
        let up = up.clone().map(&mut Cast(dtype));
        let x = Tensor::<AB, 3>::from_inner(x.clone().inner().cast(dtype)).require_grad();
        let y = gelu(up.forward(x.clone()));
        let grads = (y.clone() * y.clone()).sum().backward();
        let gw = up.weight.grad(&grads).unwrap().cast(DType::F32);
        let gb = up
            .bias
            .as_ref()
            .unwrap()
            .grad(&grads)
            .unwrap()
            .cast(DType::F32);
        (
            y.inner().cast(DType::F32).flatten::<1>(0, 2),
            gw.flatten::<1>(0, 1),
            gb,
        )
    };
    let (y16, w16, b16) = run(DType::BF16);
    let (y32, w32, b32) = run(DType::F32);
    for (what, got, want) in [("y", y16, y32), ("∂w", w16, w32), ("∂b", b16, b32)] {
        let scale = want.clone().abs().max().into_scalar();
        let gap = (got - want).abs().max().into_scalar();
        assert!(
            gap <= 16.0 * 2f32.powi(-7) * scale,
            "{what}: {gap} of {scale}"
        );
    }
}

/// GELU and its backward in `f32`: Flex's (libm's `erff`) within the vectorised `erf`'s
/// `1.5e-7`, on a contiguous and a transposed input.
#[test]
fn gelu_matches_flex() {
    let (a, a32) = both([67, 45], 20);
    let a = a * 6.0;
    let a32 = a32 * 6.0;
    close(gelu(a.clone()), gelu(a32.clone()), 1e-6, "gelu");
    close(
        gelu(a.clone().transpose()),
        gelu(a32.clone().transpose()),
        1e-6,
        "gelu transposed",
    );
    let x = Tensor::<Autodiff<FastFlex>, 2>::from_inner(a).require_grad();
    let x32 = Tensor::<Autodiff<Flex>, 2>::from_inner(a32).require_grad();
    let g = gelu(x.clone()).sum().backward();
    let g32 = gelu(x32.clone()).sum().backward();
    close(
        x.grad(&g).unwrap(),
        x32.grad(&g32).unwrap(),
        1e-6,
        "gelu backward",
    );
}

/// The vectorised functions in `bf16` and `f16`: Flex's `f32` result on the same values,
/// rounded, within one unit of the last place (an `f32` result within 1 ulp of Flex's can
/// round to the neighbouring half value); softmax and log-softmax over a transposed input.
#[test]
fn half_math_is_within_one_rounding() {
    use burn::tensor::activation::{log_softmax, softmax};
    for (dtype, ulp) in [(DType::BF16, 2f32.powi(-8)), (DType::F16, 2f32.powi(-11))] {
        let (a, a32) = super::pair([37, 129], 21, dtype);
        let (t, t32) = (a.clone().transpose(), a32.clone().transpose());
        let cases: Vec<(&str, Tensor<FastFlex, 2>, Tensor<Flex, 2>)> = vec![
            ("gelu", gelu(a.clone()), gelu(a32.clone())),
            ("exp", a.clone().exp(), a32.clone().exp()),
            ("erf", a.clone().erf(), a32.clone().erf()),
            ("tanh", a.clone().tanh(), a32.clone().tanh()),
            ("softmax", softmax(t.clone(), 1), softmax(t32.clone(), 1)),
            (
                "log_softmax",
                log_softmax(a.clone(), 1),
                log_softmax(a32.clone(), 1),
            ),
            (
                "softmax, first dimension",
                softmax(a.clone(), 0),
                softmax(a32.clone(), 0),
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got.dtype(), dtype, "{what}");
            let got = got.cast(DType::F32).into_data().to_vec::<f32>().unwrap();
            let want = want.into_data().to_vec::<f32>().unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 2.0 * ulp * w.abs() + 1e-6,
                    "{dtype:?} {what}: {g} against {w}"
                );
            }
        }
    }
}

/// `f32` exp, erf, tanh, softmax, log-softmax and layer norm against Flex's, on contiguous,
/// transposed and rank-4 inputs with rows of odd length, with and without `beta`.
#[test]
fn f32_math_and_rows_match_flex() {
    use burn::tensor::activation::{log_softmax, softmax};
    /// Burn's `layer_norm` op (what `nn::LayerNorm::forward` calls).
    fn layer_norm<B: Backend, const D: usize>(
        x: Tensor<B, D>,
        gamma: Tensor<B, 1>,
        beta: Option<Tensor<B, 1>>,
        epsilon: f64,
    ) -> Tensor<B, D> {
        use burn::tensor::TensorPrimitive;
        Tensor::from_primitive(TensorPrimitive::Float(B::layer_norm(
            x.into_primitive().tensor(),
            gamma.into_primitive().tensor(),
            beta.map(|b| b.into_primitive().tensor()),
            epsilon,
        )))
    }
    let (a, a32) = both([2, 3, 17, 45], 50);
    let (a, a32) = (a * 4.0, a32 * 4.0);
    close(a.clone().exp(), a32.clone().exp(), 1e-6, "exp");
    close(a.clone().erf(), a32.clone().erf(), 1e-6, "erf");
    close(a.clone().tanh(), a32.clone().tanh(), 1e-6, "tanh");
    close(
        softmax(a.clone(), 3),
        softmax(a32.clone(), 3),
        1e-6,
        "softmax",
    );
    close(
        softmax(a.clone().swap_dims(2, 3), 3),
        softmax(a32.clone().swap_dims(2, 3), 3),
        1e-6,
        "softmax transposed",
    );
    close(
        softmax(a.clone(), 1),
        softmax(a32.clone(), 1),
        1e-6,
        "softmax, dimension 1",
    );
    close(
        log_softmax(a.clone(), 3),
        log_softmax(a32.clone(), 3),
        1e-6,
        "log_softmax",
    );
    let (g, g32) = both([45], 51);
    let (b, b32) = both([45], 52);
    close(
        layer_norm(a.clone(), g.clone(), Some(b.clone()), 1e-5),
        layer_norm(a32.clone(), g32.clone(), Some(b32.clone()), 1e-5),
        1e-5,
        "layer_norm",
    );
    close(
        layer_norm(a.clone().swap_dims(0, 1), g, None, 1e-12),
        layer_norm(a32.clone().swap_dims(0, 1), g32, None, 1e-12),
        1e-5,
        "layer_norm permuted, no beta",
    );
    // A constant row: zero variance, the output is beta.
    let flat = Tensor::<FastFlex, 2>::ones([3, 45], &DEVICE);
    let flat32 = Tensor::<Flex, 2>::ones([3, 45], &DEVICE);
    close(
        layer_norm(flat, b.clone() * 0.0 + 1.0, Some(b), 1e-5),
        layer_norm(flat32, b32.clone() * 0.0 + 1.0, Some(b32), 1e-5),
        1e-6,
        "layer_norm of a constant row",
    );
}

/// Burn's `attention` op against Flex's own: heads split from `[b, s, h, d]` by a
/// permutation (strided operands), a padding mask `[b, 1, 1, sk]` expanded over heads and
/// queries, causal with more keys than queries, an additive bias, a softcap, and a row whose
/// every key is masked (zeros in both); `bf16` within its rounding of the `f32` result.
#[test]
fn attention_matches_flex() {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::{Bool, Tensor as T};
    let (b, h, sq, sk, d) = (2, 3, 5, 7, 8);
    let (q, q32) = both([b, sq, h, d], 30);
    let (k, k32) = both([b, sk, h, d], 31);
    let (v, v32) = both([b, sk, h, d], 32);
    let split = |t: Tensor<FastFlex, 4>| t.swap_dims(1, 2);
    let split32 = |t: Tensor<Flex, 4>| t.swap_dims(1, 2);
    let pad: Vec<bool> = (0..b * sk).map(|i| i % sk >= 5 && i / sk == 1).collect();
    let mask =
        T::<FastFlex, 4, Bool>::from_data(TensorData::new(pad.clone(), [b, 1, 1, sk]), &DEVICE)
            .expand([b, h, sq, sk]);
    let mask32 = T::<Flex, 4, Bool>::from_data(TensorData::new(pad, [b, 1, 1, sk]), &DEVICE)
        .expand([b, h, sq, sk]);
    let (bias, bias32) = both([b, h, sq, sk], 33);
    let cases = [
        ("plain", None, false, None),
        ("causal", None, true, None),
        ("softcap and scale", Some(0.7), false, Some(1.5)),
    ];
    for (what, softcap, causal, scale) in cases {
        let options = AttentionModuleOptions {
            scale,
            softcap,
            is_causal: causal,
        };
        for masked in [false, true] {
            let got = attention(
                split(q.clone()),
                split(k.clone()),
                split(v.clone()),
                masked.then(|| mask.clone()),
                masked.then(|| bias.clone()),
                options,
            );
            let want = attention(
                split32(q32.clone()),
                split32(k32.clone()),
                split32(v32.clone()),
                masked.then(|| mask32.clone()),
                masked.then(|| bias32.clone()),
                options,
            );
            close(got, want, 1e-5, &format!("{what}, masked {masked}"));
        }
    }
    // Every key masked for the second sequence: zeros, as Flex's.
    let all = T::<FastFlex, 4, Bool>::from_data(
        TensorData::new(
            (0..b * sk).map(|i| i / sk == 1).collect::<Vec<_>>(),
            [b, 1, 1, sk],
        ),
        &DEVICE,
    );
    let all32 = T::<Flex, 4, Bool>::from_data(all.clone().into_data(), &DEVICE);
    let options = AttentionModuleOptions::default();
    close(
        attention(
            split(q.clone()),
            split(k.clone()),
            split(v.clone()),
            Some(all),
            None,
            options,
        ),
        attention(
            split32(q32.clone()),
            split32(k32.clone()),
            split32(v32.clone()),
            Some(all32),
            None,
            options,
        ),
        1e-5,
        "fully masked rows",
    );
    // bf16: the f32 result of the same (rounded) inputs, within bf16's rounding.
    let half = |t: &Tensor<FastFlex, 4>| split(t.clone()).cast(DType::BF16);
    let got = attention(
        half(&q),
        half(&k),
        half(&v),
        None,
        None,
        AttentionModuleOptions::default(),
    );
    assert_eq!(got.dtype(), DType::BF16);
    let exact = |t: &Tensor<FastFlex, 4>| split(t.clone()).cast(DType::BF16).cast(DType::F32);
    let want = attention(
        exact(&q),
        exact(&k),
        exact(&v),
        None,
        None,
        AttentionModuleOptions::default(),
    );
    let gap = (got.cast(DType::F32) - want.clone())
        .abs()
        .max()
        .into_scalar();
    let scale = want.abs().max().into_scalar();
    assert!(gap <= 2f32.powi(-8) * scale, "bf16: {gap} of {scale}");
}

/// `mask_fill` with a padding mask broadcast over heads and queries, a full mask read
/// transposed, and a mask of the tensor's shape, in `f32`, `bf16` and `f16`: Flex's values
/// exactly. The operations that write into a tensor's own buffer when no other tensor holds
/// it (`mask_fill`, the activations, softmax) leave a tensor that is still held unchanged.
#[test]
fn mask_fill_and_in_place_operations_match_flex() {
    use burn::tensor::Bool;
    use burn::tensor::activation::softmax;
    let (b, h, s) = (2, 3, 9);
    let (x, x32) = both([b, h, s, s], 70);
    let pad: Vec<bool> = (0..b * s).map(|i| i % s >= 6 - i / s).collect();
    let pad_ours =
        Tensor::<FastFlex, 4, Bool>::from_data(TensorData::new(pad.clone(), [b, 1, 1, s]), &DEVICE);
    let pad_flex = Tensor::<Flex, 4, Bool>::from_data(TensorData::new(pad, [b, 1, 1, s]), &DEVICE);
    let full: Vec<bool> = (0..b * h * s * s).map(|i| (i * 7) % 5 == 0).collect();
    let full_ours = Tensor::<FastFlex, 4, Bool>::from_data(
        TensorData::new(full.clone(), [b, h, s, s]),
        &DEVICE,
    );
    let full_flex =
        Tensor::<Flex, 4, Bool>::from_data(TensorData::new(full, [b, h, s, s]), &DEVICE);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (x, x32) = (x.clone().cast(dtype), x32.clone().cast(dtype));
        let cases = [
            ("padding", pad_ours.clone(), pad_flex.clone()),
            ("full", full_ours.clone(), full_flex.clone()),
            (
                "transposed",
                full_ours.clone().swap_dims(2, 3),
                full_flex.clone().swap_dims(2, 3),
            ),
        ];
        for (what, mask, mask32) in cases {
            let got = x.clone().mask_fill(mask, -1e4).cast(DType::F32).into_data();
            let want = x32
                .clone()
                .mask_fill(mask32, -1e4)
                .cast(DType::F32)
                .into_data();
            assert_eq!(got, want, "{dtype:?} {what}");
        }
        // The held input is unchanged by each operation on its clone.
        let before = x.clone().cast(DType::F32).into_data();
        let _ = x.clone().mask_fill(pad_ours.clone(), 0.0);
        let _ = gelu(x.clone());
        let _ = softmax(x.clone(), 3);
        let _ = x.clone().exp();
        let _ = x.clone() / 3.0;
        let _ = x.clone() + x.clone();
        assert_eq!(
            x.clone().cast(DType::F32).into_data(),
            before,
            "{dtype:?}: the input changed"
        );
    }
    // A tensor no one else holds, filled in place: the same values.
    let alone = Tensor::<FastFlex, 4>::from_data(x.clone().into_data(), &DEVICE);
    close(
        alone.mask_fill(pad_ours, 7.0),
        x32.mask_fill(pad_flex, 7.0),
        0.0,
        "in place",
    );
}

/// Batched `f32` products as attention makes them (heads split by a permutation, the keys
/// transposed, a broadcast left-hand side), against Flex's within `f32` sums' rounding.
#[test]
fn batched_f32_products_match_flex() {
    let (q, q32) = both([3, 9, 5, 8], 80);
    let (k, k32) = both([3, 11, 5, 8], 81);
    let split = |t: Tensor<FastFlex, 4>| t.swap_dims(1, 2);
    let split32 = |t: Tensor<Flex, 4>| t.swap_dims(1, 2);
    close(
        split(q.clone()).matmul(split(k.clone()).transpose()),
        split32(q32.clone()).matmul(split32(k32.clone()).transpose()),
        1e-5,
        "scores",
    );
    let (p, p32) = both([3, 5, 9, 11], 82);
    close(
        p.clone().matmul(split(k.clone())),
        p32.clone().matmul(split32(k32.clone())),
        1e-5,
        "context",
    );
    let (w, w32) = both([1, 5, 11, 7], 83);
    close(
        p.matmul(w.clone()),
        p32.matmul(w32.clone()),
        1e-5,
        "broadcast right-hand side",
    );
    let (x, x32) = both([1, 1, 4, 5], 84);
    let (y, y32) = both([6, 2, 5, 3], 85);
    close(
        x.matmul(y),
        x32.matmul(y32),
        1e-5,
        "broadcast left-hand side",
    );
}

/// `f32` scalar arithmetic (in place when the buffer is not shared) and `reshape` of permuted
/// tensors (a copy per row): Flex's values, bit for bit.
#[test]
fn scalar_operations_and_permuted_reshapes_match_flex_exactly() {
    let (x, x32) = both([2, 3, 5, 7], 90);
    let exact = |got: Tensor<FastFlex, 4>, want: Tensor<Flex, 4>, what: &str| {
        assert_eq!(got.into_data(), want.into_data(), "{what}");
    };
    exact(x.clone() / 3.0, x32.clone() / 3.0, "div_scalar");
    exact(x.clone() * 0.7, x32.clone() * 0.7, "mul_scalar");
    exact(x.clone() + 0.25, x32.clone() + 0.25, "add_scalar");
    let merged = x.clone().swap_dims(1, 2).reshape([2, 5, 21]);
    let merged32 = x32.clone().swap_dims(1, 2).reshape([2, 5, 21]);
    assert_eq!(
        merged.into_data(),
        merged32.into_data(),
        "heads merged back"
    );
    let sliced = x.clone().slice([0..2, 1..3, 0..5, 2..7]).reshape([4, 25]);
    let sliced32 = x32.clone().slice([0..2, 1..3, 0..5, 2..7]).reshape([4, 25]);
    assert_eq!(sliced.into_data(), sliced32.into_data(), "sliced");
    let flipped = x.flip([3]).reshape([6, 35]);
    let flipped32 = x32.flip([3]).reshape([6, 35]);
    assert_eq!(
        flipped.into_data(),
        flipped32.into_data(),
        "flipped (Flex's copy)"
    );
}

/// Operands a fast path does not compute (`f64`, a softmax over a leading dimension) take
/// Flex's own operations, without a panic: the same values as Flex, bit for bit, forward;
/// under autodiff, through `linear`'s backward products and layer norm, within `f64`'s
/// rounding (FastFlex's `f64` `linear` is one 2-D product of Flex's, where Burn's default
/// `linear` on Flex runs a broadcast batched product: the sums are taken in another order).
#[test]
fn operands_no_fast_path_covers_take_flex_s_operation() {
    use burn::tensor::activation::softmax;
    use burn::tensor::module::{attention, linear};
    let _serial = serial();
    let f64s = |shape: [usize; 3], seed| {
        let (a, b) = both(shape, seed);
        (a.cast(DType::F64), b.cast(DType::F64))
    };
    let (x, x64) = f64s([2, 5, 12], 90);
    let (w, w64) = f64s([1, 12, 7], 91);
    let (w, w64) = (w.squeeze_dim::<2>(0), w64.squeeze_dim::<2>(0));
    let bias_data = TensorData::new(values(7, 92), [7]);
    let bias = Tensor::<FastFlex, 1>::from_data(bias_data.clone(), &DEVICE).cast(DType::F64);
    let bias64 = Tensor::<Flex, 1>::from_data(bias_data, &DEVICE).cast(DType::F64);
    let same = |got: TensorData, want: TensorData, what: &str| {
        assert_eq!(got.dtype, DType::F64, "{what}: dtype");
        assert_eq!(got, want, "{what}");
    };
    let cases: [(&str, Tensor<FastFlex, 3>, Tensor<Flex, 3>); 5] = [
        (
            "linear",
            linear(x.clone(), w.clone(), Some(bias.clone())),
            linear(x64.clone(), w64.clone(), Some(bias64.clone())),
        ),
        ("gelu", gelu(x.clone()), gelu(x64.clone())),
        ("exp", x.clone().exp(), x64.clone().exp()),
        ("softmax", softmax(x.clone(), 2), softmax(x64.clone(), 2)),
        (
            "softmax over a leading dimension",
            softmax(x.clone().cast(DType::F32), 1),
            softmax(x64.clone().cast(DType::F32), 1),
        ),
    ];
    for (what, got, want) in cases {
        let (got, want) = (got.cast(DType::F64), want.cast(DType::F64));
        same(got.into_data(), want.into_data(), what);
    }
    let q = x.clone().reshape([1, 2, 5, 12]);
    let q64 = x64.clone().reshape([1, 2, 5, 12]);
    let got = attention(q.clone(), q.clone(), q, None, None, Default::default());
    let want = attention(
        q64.clone(),
        q64.clone(),
        q64,
        None,
        None,
        Default::default(),
    );
    same(got.into_data(), want.into_data(), "attention");

    // Under autodiff: `linear`'s backward products and layer norm.
    fn run<B: burn::tensor::backend::AutodiffBackend>(
        x: TensorData,
        w: TensorData,
    ) -> Vec<TensorData> {
        let device = Default::default();
        let x = Tensor::<B, 3>::from_data(x, &device)
            .cast(DType::F64)
            .require_grad();
        let w = Tensor::<B, 2>::from_data(w, &device)
            .cast(DType::F64)
            .require_grad();
        let norm = LayerNormConfig::new(7).init::<B>(&device);
        draw_params(&norm);
        let norm = norm.map(&mut Cast(DType::F64));
        let y = norm.forward(burn::tensor::module::linear(x.clone(), w.clone(), None));
        let grads = (y.clone() * y.clone()).sum().backward();
        vec![
            y.inner().into_data(),
            x.grad(&grads).unwrap().into_data(),
            w.grad(&grads).unwrap().into_data(),
        ]
    }
    let (xd, wd) = (x.into_data(), w.into_data());
    let ours = run::<Autodiff<FastFlex>>(xd.clone(), wd.clone());
    let flex = run::<Autodiff<Flex>>(xd, wd);
    for (what, (got, want)) in ["y", "∂x", "∂w"]
        .into_iter()
        .zip(ours.into_iter().zip(flex))
    {
        assert_eq!((got.dtype, &got.shape), (DType::F64, &want.shape), "{what}");
        let (got, want) = (got.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-13 * scale,
                "f64 {what} under autodiff: {g} against {w}"
            );
        }
    }
}
