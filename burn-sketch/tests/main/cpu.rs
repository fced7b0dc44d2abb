//! Reduced precision on the CPU: Flex's sketched product with its fused activations and in
//! `bf16`, and the kernels' portable paths beside the detected ones.

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};
use burn_cpu_kernels::{Isa, MatRef, bf16, int8};
use burn_sketch::backend::{KernelStrategy, SketchWeights};
use burn_sketch::{Activation, ActivationExt, SkLinearConfig, SketchBackend};

use crate::close::relative_gap;
use crate::common;

type B = Flex;
/// Flex has one path and ignores the strategy.
const STRATEGY: KernelStrategy = KernelStrategy::Autotune;

/// The CPU paths' fused activations against Burn's own after the layer: Flex's sketched
/// product in `f32` and `bf16` on a shape of several output tiles per thread (rows past one
/// tile's 256, columns past one tile's width, neither a multiple of it).
#[test]
fn fused_activations_match_burns_own() {
    let _serial = common::serial();
    let device = Default::default();
    B::seed(&device, 23);
    let sketched = SkLinearConfig::new(40, 1100, 2, 8).init::<B>(&device);
    let x = Tensor::<B, 2>::random([600, 40], Distribution::Default, &device);
    for activation in [Activation::Relu, Activation::Gelu] {
        for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::BF16, 2f32.powi(-7))] {
            let weights =
                SketchWeights::from_array(sketched.weights().into_array().map(|w| w.cast(dtype)));
            let bias = sketched.bias.as_ref().map(|b| b.val().cast(dtype));
            let x = x.clone().cast(dtype);
            let run = |activation| {
                B::sketched_linear(
                    x.clone(),
                    weights.clone(),
                    bias.clone(),
                    activation,
                    STRATEGY,
                )
            };
            let fused = run(activation);
            assert_eq!(fused.dtype(), dtype);
            let gap = relative_gap(fused, activation.apply(run(Activation::Identity)));
            assert!(gap <= tolerance, "{activation:?} {dtype:?}: {gap}");
        }
    }
}

/// `bf16` on Flex's path (our kernel, `f32` accumulation) against the same values in `f32`,
/// forward and every gradient, within a few `bf16` epsilons (2⁻⁷) of the largest value.
#[test]
fn bf16_matches_f32_within_its_precision() {
    crate::flex::half_precision_matches_f32(DType::BF16, 2f32.powi(-7));
}

/// The products under Flex's `bf16` and `int8` paths on both kernel paths, in this process
/// ([`Isa::PORTABLE`] and [`Isa::detected`]), against their references. The layer above them
/// (`bf16_matches_f32_within_its_precision`) runs on the detected path: Flex's sketched
/// product has no per-call choice of path, and its plumbing is the same on both.
#[test]
fn the_portable_paths_match_the_references() {
    let (m, k, n) = (19, 37, 23);
    let a: Vec<half::bf16> = (0..m * k)
        .map(|i| half::bf16::from_f32(((i * 7) % 13) as f32 / 6.5 - 1.0))
        .collect();
    let b: Vec<half::bf16> = (0..k * n)
        .map(|i| half::bf16::from_f32(((i * 5) % 11) as f32 / 5.5 - 1.0))
        .collect();
    let (lhs, rhs) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
    let xs: Vec<f32> = (0..m * k).map(|i| ((i * 31) % 17) as f32 - 8.0).collect();
    let ws: Vec<f32> = (0..k * n)
        .map(|i| ((i * 3) % 7) as f32 / 7.0 - 0.5)
        .collect();
    let exact: Vec<f32> = (0..m * n)
        .map(|q| (0..k).map(|p| xs[q / n * k + p] * ws[p * n + q % n]).sum())
        .collect();
    let scale = exact.iter().fold(0f32, |s, v| s.max(v.abs()));
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let mut y = vec![0.0f32; m * n];
        bf16::matmul_on(isa, &mut y, n, lhs, rhs, 1.0, false, true);
        for (got, want) in y.iter().zip(bf16::reference(lhs, rhs, 1.0)) {
            assert!(
                (*got as f64 - want).abs() < 1e-4,
                "{isa:?}: {got} against {want}"
            );
        }

        let x = int8::QuantizedRows::quantize_on(isa, MatRef::row_major(&xs, m, k), true);
        let w = int8::QuantizedMatrix::quantize(MatRef::row_major(&ws, k, n));
        let mut y = vec![0.0f32; m * n];
        let e = int8::Epilogue {
            alpha: 1.0,
            bias: None,
            accumulate: false,
            activation: Activation::Identity,
        };
        int8::matmul_on(isa, &mut y, n, &x, &w, e, true);
        for (got, want) in y.iter().zip(&exact) {
            assert!(
                (got - want).abs() < 0.02 * scale,
                "{isa:?}: {got} against {want}"
            );
        }
    }
}
