//! `SkLinear` on Flex, Burn's pure-Rust CPU backend (its own `gemm` path), and under autodiff:
//! the backend-generic checks, then what only Flex has: strided inputs straight into `gemm`,
//! `f16`, and partial gradient requests.

use burn::backend::flex::FlexDevice;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};
use burn_sketch::backend::{KernelStrategy, SketchWeights, WantedGradients};
use burn_sketch::{Activation, SkLinearConfig, SketchBackend};

use crate::common;

type B = Flex;
type AB = Autodiff<Flex>;
const DEVICE: FlexDevice = FlexDevice;
/// Flex has one implementation of the product; it takes the default strategy and ignores it.
const STRATEGY: KernelStrategy = KernelStrategy::Autotune;
const IDENTITY: Activation = Activation::Identity;

backend_suite!(B, AB, DEVICE, STRATEGY);

#[test]
fn training_step_matches_ndarray() {
    common::training_step_matches::<Autodiff<NdArray>, AB>(
        &NdArrayDevice::default(),
        &DEVICE,
        STRATEGY,
    );
}

#[test]
fn panther_checkpoints_match_ndarray() {
    common::panther_checkpoints_match_ndarray::<B>(&DEVICE, STRATEGY);
}

/// A layer, an input and an output gradient on Flex.
fn operands(
    rows: usize,
    d_in: usize,
    d_out: usize,
    terms: usize,
    k: usize,
) -> (burn_sketch::SkLinear<B>, Tensor<B, 2>, Tensor<B, 2>) {
    let layer = SkLinearConfig::new(d_in, d_out, terms, k).init::<B>(&DEVICE);
    let x = Tensor::<B, 2>::random([rows, d_in], Distribution::Default, &DEVICE);
    let g = Tensor::<B, 2>::random([rows, d_out], Distribution::Default, &DEVICE);
    (layer, x, g)
}

#[test]
fn strided_inputs_match_contiguous_ones() {
    let _serial = common::serial();
    B::seed(&DEVICE, 11);
    let (layer, x, g) = operands(70, 33, 19, 2, 5);
    let bias = layer.bias.as_ref().map(|b| b.val());
    // The same values as a transposed view, and a column slice of a wider tensor.
    let transposed = x.clone().transpose().into_data();
    let x_t = Tensor::<B, 2>::from_data(transposed, &DEVICE).transpose();
    let wide = Tensor::cat(vec![x.clone(), x.clone()], 1);
    let x_slice = wide.slice([0..70, 33..66]);
    // A broadcast-free but strided bias: every other element of a longer vector.
    let long_bias = bias
        .clone()
        .map(|b| Tensor::stack::<2>(vec![b.clone(), b], 1).reshape([38]));
    let strided_bias = long_bias.map(|b| b.reshape([19, 2]).slice([0..19, 0..1]).reshape([19]));

    let expected = B::sketched_linear(x.clone(), layer.weights(), bias.clone(), IDENTITY, STRATEGY);
    for (input, name) in [(x_t.clone(), "transposed"), (x_slice.clone(), "sliced")] {
        let actual = B::sketched_linear(input, layer.weights(), bias.clone(), IDENTITY, STRATEGY);
        common::assert_close(actual.into_data(), expected.clone().into_data(), name);
    }
    let actual = B::sketched_linear(x.clone(), layer.weights(), strided_bias, IDENTITY, STRATEGY);
    common::assert_close(actual.into_data(), expected.into_data(), "strided bias");

    let expected = B::sketched_linear_backward(
        x.clone(),
        layer.weights(),
        g.clone(),
        WantedGradients::ALL,
        STRATEGY,
    );
    let actual = B::sketched_linear_backward(
        x_t,
        layer.weights(),
        Tensor::<B, 2>::from_data(g.clone().transpose().into_data(), &DEVICE).transpose(),
        WantedGradients::ALL,
        STRATEGY,
    );
    common::assert_close(
        actual.x.unwrap().into_data(),
        expected.x.unwrap().into_data(),
        "∂x",
    );
    common::assert_close(
        actual.s1s.unwrap().into_data(),
        expected.s1s.unwrap().into_data(),
        "∂S1s",
    );
    common::assert_close(
        actual.s2s.unwrap().into_data(),
        expected.s2s.unwrap().into_data(),
        "∂S2s",
    );
}

#[test]
fn only_wanted_gradients_are_returned_and_they_match() {
    let _serial = common::serial();
    B::seed(&DEVICE, 12);
    let (layer, x, g) = operands(90, 21, 17, 3, 4);
    let all = B::sketched_linear_backward(
        x.clone(),
        layer.weights(),
        g.clone(),
        WantedGradients::ALL,
        STRATEGY,
    );
    let all = [
        all.x.map(|t| t.into_data()),
        all.s1s.map(|t| t.into_data()),
        all.s2s.map(|t| t.into_data()),
        all.u1s.map(|t| t.into_data()),
        all.u2s.map(|t| t.into_data()),
    ];
    for mask in 0..32u32 {
        let flags: [bool; 5] = std::array::from_fn(|i| mask & (1 << i) != 0);
        let wanted = WantedGradients::from_array(flags);
        let some =
            B::sketched_linear_backward(x.clone(), layer.weights(), g.clone(), wanted, STRATEGY);
        let some = [
            some.x.map(|t| t.into_data()),
            some.s1s.map(|t| t.into_data()),
            some.s2s.map(|t| t.into_data()),
            some.u1s.map(|t| t.into_data()),
            some.u2s.map(|t| t.into_data()),
        ];
        for (i, (got, full)) in some.into_iter().zip(&all).enumerate() {
            let name = burn_sketch::backend::OPERANDS[i];
            match got {
                Some(got) => {
                    assert!(flags[i], "mask {mask:05b}: ∂{name} computed but not wanted");
                    common::assert_close(
                        got,
                        full.clone().unwrap(),
                        &format!("∂{name}, mask {mask:05b}"),
                    );
                }
                None => assert!(!flags[i], "mask {mask:05b}: ∂{name} wanted but missing"),
            }
        }
    }
}

/// `f16` through `gemm`'s half-precision kernels against the same values in `f32`: the
/// tolerance is relative to the largest output, a few `f16` epsilons (2⁻¹⁰) for these depths.
#[test]
fn f16_matches_f32_within_half_precision() {
    half_precision_matches_f32(DType::F16, 2f32.powi(-10));
}

/// Flex's path in `dtype` (`f16` on `gemm`, `bf16` on burn-sketch's kernel) against the same
/// values in `f32`, forward and the gradients, within 8 `epsilon`s of the largest value; and
/// not equal to the bit (which would mean it ran in `f32`).
pub fn half_precision_matches_f32(dtype: DType, epsilon: f32) {
    let _serial = common::serial();
    B::seed(&DEVICE, 13);
    let (layer, x, g) = operands(80, 48, 24, 2, 6);
    let half = |t: Tensor<B, 3>| t.cast(dtype);
    let weights16 = SketchWeights::from_array(layer.weights().into_array().map(half));
    let bias = layer.bias.as_ref().map(|b| b.val());
    let (x16, g16) = (x.clone().cast(dtype), g.clone().cast(dtype));
    let bias16 = bias.clone().map(|b| b.cast(dtype));

    let y16 = B::sketched_linear(x16.clone(), weights16.clone(), bias16, IDENTITY, STRATEGY);
    assert_eq!(y16.dtype(), dtype, "{dtype:?} in, {dtype:?} out");
    let y32 = B::sketched_linear(x.clone(), layer.weights(), bias, IDENTITY, STRATEGY);
    let within =
        |actual: burn::tensor::TensorData, expected: burn::tensor::TensorData, what: &str| {
            let (a, e) = (
                actual.convert::<f32>().to_vec::<f32>().unwrap(),
                expected.to_vec::<f32>().unwrap(),
            );
            let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(&e)
                .map(|(a, e)| (a - e).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 8.0 * epsilon * scale,
                "{what}: {dtype:?} off by {worst} (scale {scale})"
            );
            assert!(
                worst > 0.0,
                "{what}: {dtype:?} equal to f32 to the bit: was it computed in {dtype:?}?"
            );
        };
    within(y16.into_data(), y32.into_data(), "y");

    let grads16 = B::sketched_linear_backward(x16, weights16, g16, WantedGradients::ALL, STRATEGY);
    let grads32 =
        B::sketched_linear_backward(x, layer.weights(), g, WantedGradients::ALL, STRATEGY);
    within(
        grads16.x.unwrap().into_data(),
        grads32.x.unwrap().into_data(),
        "∂x",
    );
    within(
        grads16.s1s.unwrap().into_data(),
        grads32.s1s.unwrap().into_data(),
        "∂S1s",
    );
    within(
        grads16.s2s.unwrap().into_data(),
        grads32.s2s.unwrap().into_data(),
        "∂S2s",
    );
    within(
        grads16.u1s.unwrap().into_data(),
        grads32.u1s.unwrap().into_data(),
        "∂U1s",
    );
}
