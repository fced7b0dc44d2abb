//! Layer norm, softmax, log-softmax and cross-entropy against Burn's own (decomposed under
//! autodiff) operations.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::nn::LayerNormConfig;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_fast_cpu::FastFlex;
use burn_fused::{
    FusedBackend, fused_cross_entropy, fused_layer_norm_module, fused_log_softmax, fused_softmax,
    layer_norm::layer_norm_epsilon,
};

use super::common::{assert_close, seeded};

fn grad_of<B: AutodiffBackend, const D: usize>(
    t: &Tensor<B, D>,
    grads: &B::Gradients,
) -> Tensor<B, D> {
    Tensor::from_inner(t.grad(grads).expect("a gradient"))
}

fn layer_norm_cases<B: AutodiffBackend + FusedBackend>(tolerance: f64) {
    let device = Default::default();
    for (shape, bias, epsilon) in [
        ([3, 5, 7], true, 1e-5),
        ([1, 1, 1], true, 1e-5),
        ([2, 9, 384], false, 1e-12),
        ([0, 4, 8], true, 1e-5),
    ] {
        let n = shape[2];
        let mut norm = LayerNormConfig::new(n)
            .with_bias(bias)
            .with_epsilon(epsilon)
            .init::<B>(&device);
        assert_eq!(layer_norm_epsilon(&norm), epsilon);
        norm.gamma = norm
            .gamma
            .map(|_| seeded::<B, 1>([n], 5, 2.0, &device).require_grad());
        if let Some(beta) = norm.beta.take() {
            norm.beta = Some(beta.map(|_| seeded::<B, 1>([n], 6, 1.0, &device).require_grad()));
        }
        let x = seeded::<B, 3>(shape, 7, 3.0, &device).add_scalar(1.0);
        let w = seeded::<B, 3>(shape, 8, 1.0, &device);
        let run = |fused: bool| {
            let x = x.clone().require_grad();
            let y = if fused {
                fused_layer_norm_module(&norm, x.clone())
            } else {
                norm.forward(x.clone())
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            let gamma = norm
                .gamma
                .val()
                .grad(&grads)
                .map(Tensor::<B, 1>::from_inner);
            let beta = norm
                .beta
                .as_ref()
                .and_then(|b| b.val().grad(&grads))
                .map(Tensor::<B, 1>::from_inner);
            (
                y,
                x.grad(&grads).map(Tensor::<B, 3>::from_inner),
                gamma,
                beta,
            )
        };
        let what = format!("{} layer norm {shape:?}", B::name(&device));
        let (y, dx, dg, db) = run(true);
        let (ey, edx, edg, edb) = run(false);
        assert_close(y, ey, tolerance, &what);
        for (name, (g, e)) in [("dgamma", (dg, edg)), ("dbeta", (db, edb))] {
            if shape[0] > 0 || e.is_some() {
                assert_eq!(g.is_some(), e.is_some(), "{what}: {name} present");
            }
            if let (Some(g), Some(e)) = (g, e) {
                assert_close(g, e, tolerance, &format!("{what}: {name}"));
            }
        }
        if let (Some(dx), Some(edx)) = (dx, edx) {
            assert_close(dx, edx, tolerance, &format!("{what}: dx"));
        }
    }
}

fn softmax_cases<B: AutodiffBackend + FusedBackend>(tolerance: f64) {
    let device = Default::default();
    for (shape, dim) in [
        ([2, 3, 7], 2),
        ([4, 5, 6], 1),
        ([1, 1, 1], 2),
        ([3, 2, 1000], 2),
    ] {
        let x = seeded::<B, 3>(shape, 11, 6.0, &device);
        let w = seeded::<B, 3>(shape, 12, 1.0, &device);
        for log in [false, true] {
            let run = |fused: bool| {
                let x = x.clone().require_grad();
                let y = match (fused, log) {
                    (true, false) => fused_softmax(x.clone(), dim),
                    (true, true) => fused_log_softmax(x.clone(), dim),
                    (false, false) => softmax(x.clone(), dim),
                    (false, true) => log_softmax(x.clone(), dim),
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, grad_of(&x, &grads))
            };
            let what = format!(
                "{} softmax (log {log}) {shape:?} over {dim}",
                B::name(&device)
            );
            let ((y, dx), (ey, edx)) = (run(true), run(false));
            assert_close(y, ey, tolerance, &what);
            assert_close(dx, edx, tolerance, &format!("{what}: dx"));
        }
    }
}

fn cross_entropy_cases<B: AutodiffBackend + FusedBackend>(tolerance: f64) {
    let device = Default::default();
    for (rows, classes, ignore) in [
        (6, 97, None),
        (1, 1, None),
        (5, 13, Some(2)),
        (64, 1000, None),
    ] {
        let logits = seeded::<B, 2>([rows, classes], 21, 8.0, &device);
        let targets: Vec<i64> = (0..rows).map(|r| ((r * 7 + 3) % classes) as i64).collect();
        let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets, [rows]), &device);
        let run = |fused: bool| {
            let logits = logits.clone().require_grad();
            let loss = if fused {
                fused_cross_entropy(logits.clone(), targets.clone(), ignore)
            } else {
                let config = CrossEntropyLossConfig::new().with_pad_tokens(ignore.map(|i| vec![i]));
                config
                    .init(&device)
                    .forward(logits.clone(), targets.clone())
            };
            let grads = loss.clone().mul_scalar(3.0).backward();
            (loss, grad_of(&logits, &grads))
        };
        let what = format!(
            "{} cross-entropy {rows} x {classes} ignoring {ignore:?}",
            B::name(&device)
        );
        let ((loss, dx), (e_loss, e_dx)) = (run(true), run(false));
        assert_close(loss, e_loss, tolerance, &what);
        assert_close(dx, e_dx, tolerance, &format!("{what}: dlogits"));
    }
}

#[test]
fn ndarray_rows_match_burn() {
    layer_norm_cases::<Autodiff<NdArray>>(1e-5);
    softmax_cases::<Autodiff<NdArray>>(1e-5);
    cross_entropy_cases::<Autodiff<NdArray>>(1e-5);
}

#[test]
fn flex_rows_match_burn() {
    layer_norm_cases::<Autodiff<Flex>>(1e-5);
    softmax_cases::<Autodiff<Flex>>(1e-5);
    cross_entropy_cases::<Autodiff<Flex>>(1e-5);
}

#[test]
fn fast_flex_rows_match_burn() {
    layer_norm_cases::<Autodiff<FastFlex>>(1e-5);
    softmax_cases::<Autodiff<FastFlex>>(1e-5);
    cross_entropy_cases::<Autodiff<FastFlex>>(1e-5);
}

/// Layer norm's forward against an `f64` reference, on enough rows for the backends' vector
/// paths: a reciprocal computed approximately (NdArray's `recip`, about 1e-4) shows here.
fn layer_norm_matches_f64<B: FusedBackend>() {
    let device = Default::default();
    let (rows, n) = (45, 32);
    let x = seeded::<B, 2>([rows, n], 4, 2.0, &device);
    let gamma = seeded::<B, 1>([n], 5, 2.0, &device);
    let xs = super::common::values(x.clone());
    let gs = super::common::values(gamma.clone());
    let expected: Vec<f64> = xs
        .chunks(n)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            let rstd = 1.0 / (var + 1e-12).sqrt();
            row.iter()
                .zip(&gs)
                .map(move |(v, g)| (v - mean) * rstd * g)
                .collect::<Vec<_>>()
        })
        .collect();
    let expected = Tensor::<B, 2>::from_data(TensorData::new(expected, [rows, n]), &device);
    let output = burn_fused::fused_layer_norm(x, gamma, None, 1e-12);
    let what = format!("{} layer norm against f64", B::name(&device));
    assert_close(output, expected, 2e-6, &what);
}

#[test]
fn layer_norm_is_exact_on_every_backend() {
    layer_norm_matches_f64::<NdArray>();
    layer_norm_matches_f64::<Flex>();
    layer_norm_matches_f64::<FastFlex>();
}
