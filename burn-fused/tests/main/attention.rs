//! `fused_attention` against the composition Burn's autodiff differentiates (and, without
//! dropout, Burn's own attention forward).

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Tensor, TensorData};
use burn_fast_cpu::FastFlex;
use burn_fused::{AttentionDropout, AttentionOptions, FusedBackend, composed, fused_attention};

use super::common::{assert_close, seeded};

/// Which mask a case has.
#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    /// `[b, 1, 1, sk]`: the last `b_index + 1` keys of each batch padded; with `all`, the
    /// last batch entirely (its queries see no key).
    Padding {
        all: bool,
    },
    /// `[b, h, sq, sk]`, every score masked at random.
    Full,
}

fn mask<B: AutodiffBackend>(
    case: Mask,
    [b, h, sq, sk]: [usize; 4],
    device: &B::Device,
) -> Option<Tensor<B, 4, Bool>> {
    match case {
        Mask::None => None,
        Mask::Padding { all } => {
            let values: Vec<bool> = (0..b * sk)
                .map(|at| {
                    let (bi, j) = (at / sk, at % sk);
                    (all && bi == b - 1) || j + bi + 1 >= sk.max(1) && j > 0
                })
                .collect();
            Some(Tensor::from_data(
                TensorData::new(values, [b, 1, 1, sk]),
                device,
            ))
        }
        Mask::Full => {
            let noise = burn_cpu_kernels::testing::uniform(b * h * sq * sk, 77, [0.0, 1.0]);
            let values: Vec<bool> = noise.iter().map(|&u| u < 0.3).collect();
            Some(Tensor::from_data(
                TensorData::new(values, [b, h, sq, sk]),
                device,
            ))
        }
    }
}

/// Forward and the three gradients of one case, fused against decomposed.
fn case<B: AutodiffBackend + FusedBackend>(
    [b, h, sq, sk, d, dv]: [usize; 6],
    mask_case: Mask,
    options: AttentionOptions,
    tolerance: f64,
) where
    B::InnerBackend: FusedBackend,
{
    let device = Default::default();
    let q = seeded::<B, 4>([b, h, sq, d], 1, 1.5, &device);
    let k = seeded::<B, 4>([b, h, sk, d], 2, 1.5, &device);
    let v = seeded::<B, 4>([b, h, sk, dv], 3, 1.0, &device);
    let w = seeded::<B, 4>([b, h, sq, dv], 4, 1.0, &device);
    let mask = mask::<B>(mask_case, [b, h, sq, sk], &device);
    let what = format!(
        "{:?} {:?} {mask_case:?} {options:?}",
        B::name(&device),
        [b, h, sq, sk, d, dv]
    );
    let run = |fused: bool| {
        let [q, k, v] = [&q, &k, &v].map(|t| t.clone().require_grad());
        let out = if fused {
            fused_attention(q.clone(), k.clone(), v.clone(), mask.clone(), options)
        } else {
            composed::attention_forward(q.clone(), k.clone(), v.clone(), mask.clone(), options)
                .output
        };
        let grads = (out.clone() * w.clone()).sum().backward();
        let grad = |t: &Tensor<B, 4>| t.grad(&grads).map(Tensor::<B, 4>::from_inner);
        (out, [grad(&q), grad(&k), grad(&v)])
    };
    let (out, grads) = run(true);
    let (expected, expected_grads) = run(false);
    assert_close(out.clone(), expected, tolerance, &format!("{what}: output"));
    for (name, (g, e)) in ["dq", "dk", "dv"]
        .iter()
        .zip(grads.into_iter().zip(expected_grads))
    {
        match (g, e) {
            (Some(g), Some(e)) => assert_close(g, e, tolerance, &format!("{what}: {name}")),
            (None, None) if sq * sk == 0 => {}
            (g, e) => panic!(
                "{what}: {name} present {} expected {}",
                g.is_some(),
                e.is_some()
            ),
        }
    }
    if options.dropout.is_none() && sq * sk > 0 {
        // Burn's own attention: the same semantics.
        let burn_mask = mask.map(|m| m.expand([b, h, sq, sk]));
        let burn_options = AttentionModuleOptions {
            scale: options.scale,
            softcap: None,
            is_causal: options.causal,
        };
        let burn = burn::tensor::module::attention(q, k, v, burn_mask, None, burn_options);
        assert_close(
            out,
            burn,
            tolerance,
            &format!("{what}: against Burn's attention"),
        );
    }
}

const SHAPES: [[usize; 6]; 6] = [
    [2, 3, 5, 7, 4, 6],
    [1, 1, 1, 1, 1, 1],
    [1, 2, 9, 4, 3, 2],
    [2, 2, 33, 33, 8, 8],
    [1, 1, 70, 300, 16, 5],
    [1, 2, 130, 130, 64, 64],
];

fn all_cases<B: AutodiffBackend + FusedBackend>(tolerance: f64)
where
    B::InnerBackend: FusedBackend,
{
    let dropout = Some(AttentionDropout {
        prob: 0.25,
        seed: 9,
    });
    for shape in SHAPES {
        for causal in [false, true] {
            for mask_case in [Mask::None, Mask::Padding { all: true }, Mask::Full] {
                let options = AttentionOptions {
                    causal,
                    ..Default::default()
                };
                case::<B>(shape, mask_case, options, tolerance);
            }
            let options = AttentionOptions {
                causal,
                dropout,
                scale: Some(0.3),
            };
            case::<B>(shape, Mask::Padding { all: false }, options, tolerance);
        }
    }
}

#[test]
fn ndarray_matches_the_decomposition() {
    all_cases::<Autodiff<NdArray>>(1e-4);
}

#[test]
fn flex_matches_the_decomposition() {
    all_cases::<Autodiff<Flex>>(1e-4);
}

#[test]
fn fast_flex_matches_the_decomposition() {
    all_cases::<Autodiff<FastFlex>>(1e-4);
}

/// Empty sequences: no panic, and the output is empty or zeros.
#[test]
fn empty_sequences() {
    type B = Autodiff<FastFlex>;
    let device = Default::default();
    for [sq, sk] in [[0, 4], [4, 0]] {
        let q = seeded::<B, 4>([1, 2, sq, 3], 1, 1.0, &device).require_grad();
        let k = seeded::<B, 4>([1, 2, sk, 3], 2, 1.0, &device).require_grad();
        let v = seeded::<B, 4>([1, 2, sk, 3], 3, 1.0, &device).require_grad();
        let out = fused_attention(q.clone(), k, v, None, AttentionOptions::default());
        assert_eq!(out.dims(), [1, 2, sq, 3]);
        let total: f32 = out.clone().abs().sum().into_scalar();
        assert_eq!(total, 0.0);
        let grads = out.sum().backward();
        if let Some(g) = q.grad(&grads) {
            assert_eq!(g.dims(), [1, 2, sq, 3]);
        }
    }
}

/// Heads split from `[b, s, h, d]` by a permutation (strided operands), and bf16.
#[test]
fn permuted_and_bf16_operands() {
    fn run<B: AutodiffBackend + FusedBackend>(dtype: DType, tolerance: f64)
    where
        B::InnerBackend: FusedBackend,
    {
        let device = Default::default();
        let split = |seed| {
            seeded::<B, 4>([2, 17, 3, 8], seed, 1.0, &device)
                .swap_dims(1, 2)
                .cast(dtype)
        };
        let [q, k, v] = [1, 2, 3].map(split);
        let options = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let run = |fused: bool| {
            let [q, k, v] = [&q, &k, &v].map(|t| t.clone().require_grad());
            let out = if fused {
                fused_attention(q.clone(), k.clone(), v.clone(), None, options)
            } else {
                composed::attention_forward(q.clone(), k.clone(), v.clone(), None, options).output
            };
            let grads = out.clone().cast(DType::F32).powi_scalar(2).sum().backward();
            let g = [&q, &k, &v]
                .map(|t| Tensor::<B, 4>::from_inner(t.grad(&grads).expect("a gradient")));
            (out, g)
        };
        let ((out, g), (e_out, e_g)) = (run(true), run(false));
        assert_close(out, e_out, tolerance, "output");
        for (g, e) in g.into_iter().zip(e_g) {
            assert_close(g, e, tolerance, "gradient");
        }
    }
    run::<Autodiff<FastFlex>>(DType::F32, 1e-4);
    run::<Autodiff<Flex>>(DType::F32, 1e-4);
    run::<Autodiff<FastFlex>>(DType::BF16, 3e-2);
}

/// The dropout mask is the same in the forward and the backward, differs between seeds,
/// and keeps about `1 − p` of the probabilities.
#[test]
fn dropout_is_seeded() {
    let shape = [2, 3, 40, 50];
    let mask =
        |seed| burn_fused::attention::dropout_mask(AttentionDropout { prob: 0.25, seed }, shape);
    let (a, b) = (mask(1), mask(2));
    assert_eq!(a, mask(1));
    assert_ne!(a, b);
    let kept = a.iter().filter(|&&k| k).count() as f64 / a.len() as f64;
    assert!((kept - 0.75).abs() < 0.02, "kept {kept}");
}
