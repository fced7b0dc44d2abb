//! `PerformerAttention` (FAVOR+, Panther's `RandMultiHeadAttention`) on Flex and NdArray (the
//! `wgpu` module runs the forward and gradient checks on Wgpu):
//! outputs and gradients against the quadratic form, causality and padding (exact), the
//! estimate of softmax attention as the feature count grows, construction from dense
//! attention (ours and Burn's), records, and Panther checkpoints (the fixture's outputs come
//! from a numpy transcription of Panther's forward pass, `tests/data/make_performer_fixture.py`).

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::nn::attention::{MhaInput, MultiHeadAttentionConfig as BurnMhaConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Distribution, ElementConversion, Tensor, TensorData};
use burn_compress::CompressError;
use burn_compress::{
    AnyMultiHeadAttention, AnyMultiHeadAttentionConfig, FeatureMap, LinearKind, LinearLayer,
    PerformerAttention, PerformerAttentionConfig,
};
use burn_compress::{load_performer, load_performer_from_bytes};
use burn_sketch::{SketchBackend, SketchError};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::close::{assert_close, serial};

/// One `#[test]` per backend-generic check below, for a backend `$b` (and `Autodiff<$b>`).
macro_rules! performer_suite {
    ($name:ident, $b:ty) => {
        mod $name {
            type B = $b;
            type AB = burn::backend::Autodiff<$b>;

            #[test]
            fn forward_matches_reference() {
                super::forward_matches_reference::<B>(&Default::default());
            }

            #[test]
            fn gradients_match_reference() {
                super::gradients_match_reference::<AB>(&Default::default());
            }

            #[test]
            fn causal_outputs_ignore_the_future() {
                super::causal_outputs_ignore_the_future::<B>(&Default::default());
            }

            #[test]
            fn padded_keys_are_ignored() {
                super::padded_keys_are_ignored::<B>(&Default::default());
            }

            #[test]
            fn approaches_softmax_attention() {
                super::approaches_softmax_attention::<B>(&Default::default());
            }

            #[test]
            fn built_from_dense_attention() {
                super::built_from_dense_attention::<B>(&Default::default());
            }

            #[test]
            fn record_round_trip_is_exact() {
                super::record_round_trip_is_exact::<B>(&Default::default());
            }

            #[test]
            fn init_is_seeded_and_orthogonal() {
                super::init_is_seeded_and_orthogonal::<B>(&Default::default());
            }

            #[test]
            fn projection_is_not_trained() {
                super::projection_is_not_trained::<AB>(&Default::default());
            }

            #[test]
            fn panther_fixture_matches_panther_math() {
                super::panther_fixture_matches_panther_math::<B>(&Default::default());
            }
        }
    };
}

performer_suite!(flex, burn::backend::Flex);
performer_suite!(ndarray, burn::backend::NdArray);

const D_MODEL: usize = 12;
const HEADS: usize = 3;
/// Not a multiple of `d_head` (4): two full orthogonal blocks and a partial one.
const FEATURES: usize = 10;
const SEQ: usize = 7;

fn config(feature_map: FeatureMap, causal: bool) -> PerformerAttentionConfig {
    PerformerAttentionConfig::new(D_MODEL, HEADS)
        .with_num_features(FEATURES)
        .with_feature_map(feature_map)
        .with_causal(causal)
}

fn normal<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

/// `[batch, seq]` padding mask from rows of booleans (`true` = padding).
fn pad_mask<B: Backend>(rows: &[&[bool]], device: &B::Device) -> Tensor<B, 2, Bool> {
    let seq = rows[0].len();
    let flat = rows
        .iter()
        .flat_map(|r| r.iter().copied())
        .collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(flat, [rows.len(), seq]), device)
}

/// Batch 0 padded at its end, batch 1 at its start and in the middle (so that causal query 0
/// of batch 1 has no key at all).
fn padding<B: Backend>(device: &B::Device) -> Tensor<B, 2, Bool> {
    let t = true;
    let f = false;
    pad_mask(&[&[f, f, f, f, f, t, t], &[t, f, f, t, f, f, f]], device)
}

fn values<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    x.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

/// Performer attention the long way, quadratic in the sequence: the features of every query,
/// then for each query `i` and key `j` it may see (not later, when causal; not padding) the
/// key's features stabilised for that query (by the largest `W·k'` over the features and the
/// keys `i` sees), `A_ij = φ(q_i)·φ_i(k_j)` summed explicitly over the features, and
/// `out_i = Σ_j A_ij v_j / Σ_j A_ij`. No prefix sums, no chunks, no carried state.
fn reference<B: SketchBackend>(
    module: &PerformerAttention<B>,
    x: Tensor<B, 3>,
    pad: Option<Tensor<B, 2, Bool>>,
) -> Tensor<B, 3> {
    let [b, n, d] = x.dims();
    let h = module.n_heads;
    let dh = d / h;
    let device = x.device();
    let heads = |t: Tensor<B, 3>| t.reshape([b, n, h, dh]).swap_dims(1, 2);
    let q = heads(module.query.forward(x.clone()));
    let k = heads(module.key.forward(x.clone()));
    let v = heads(module.value.forward(x));
    let w = module.projection.val();
    let f = w.dims()[0];
    let ratio = 1.0 / (f as f64).sqrt();
    let eps = module.kernel_epsilon;
    let project = |t: Tensor<B, 4>| {
        t.reshape([b * h * n, dh])
            .matmul(w.clone().transpose())
            .reshape([b, h, n, f])
    };

    // Through integers: Wgpu stores booleans as `u32`, which `to_vec::<bool>` refuses.
    let pad = pad.map(|p| {
        let flags = p.int().into_data().convert::<i64>();
        flags.iter::<i64>().map(|v| v != 0).collect::<Vec<_>>()
    });
    let mut allowed = vec![1.0f32; b * n * n];
    for batch in 0..b {
        for i in 0..n {
            for j in 0..n {
                let padded = pad.as_ref().is_some_and(|p| p[batch * n + j]);
                if (module.causal && j > i) || padded {
                    allowed[(batch * n + i) * n + j] = 0.0;
                }
            }
        }
    }
    let allowed = Tensor::<B, 4>::from_data(TensorData::new(allowed, [b, 1, n, n]), &device);
    let blocked = allowed.clone().equal_elem(0.0);

    let weights = match module.feature_map {
        FeatureMap::Softmax => {
            let s = (dh as f64).powf(-0.25);
            let (qs, ks) = (q.mul_scalar(s), k.mul_scalar(s));
            let (dq, dk) = (project(qs.clone()), project(ks.clone()));
            let half_q = qs.square().sum_dim(3).div_scalar(2.0);
            let half_k = ks.square().sum_dim(3).div_scalar(2.0);
            let phi_q = (dq.clone() - half_q - dq.max_dim(3))
                .exp()
                .add_scalar(eps)
                .mul_scalar(ratio);
            let largest = dk.clone().max_dim(3).swap_dims(2, 3).expand([b, h, n, n]);
            let stabiliser = largest
                .mask_fill(blocked.clone().expand([b, h, n, n]), -1.0e4)
                .max_dim(3);
            let full = [b, h, n, n, f];
            let exponent = dk.unsqueeze_dim::<5>(2).expand(full)
                - half_k.unsqueeze_dim::<5>(2).expand(full)
                - stabiliser.unsqueeze_dim::<5>(4).expand(full);
            let exponent = exponent.mask_fill(blocked.unsqueeze_dim::<5>(4).expand(full), -1.0e4);
            let phi_k = exponent.exp().add_scalar(eps).mul_scalar(ratio);
            (phi_q.unsqueeze_dim::<5>(3).expand(full) * phi_k)
                .sum_dim(4)
                .reshape([b, h, n, n])
        }
        FeatureMap::Relu => {
            let phi_q = relu(project(q).mul_scalar(ratio)).add_scalar(eps);
            let phi_k = relu(project(k).mul_scalar(ratio)).add_scalar(eps);
            phi_q.matmul(phi_k.swap_dims(2, 3))
        }
    } * allowed;
    let numerator = weights.clone().matmul(v);
    let denominator = weights.sum_dim(3);
    let denominator = denominator
        .clone()
        .mask_fill(denominator.equal_elem(0.0), 1.0);
    let context = (numerator / denominator).swap_dims(1, 2).reshape([b, n, d]);
    module.output.forward(context)
}

/// Every feature map, causal or not, with and without padding, and (causal) chunks of 1, 3, 4
/// (an even length: Burn's fusion once got the in-chunk decay wrong there) and more than the
/// sequence, equals the quadratic form; sketched projections too; and the
/// last causal output, whose prefix is the whole sequence, is the non-causal one.
pub fn forward_matches_reference<B: SketchBackend>(device: &B::Device) {
    let _serial = serial();
    B::seed(device, 1);
    let x = normal::<B, 3>([2, SEQ, D_MODEL], device);
    for feature_map in [FeatureMap::Softmax, FeatureMap::Relu] {
        for causal in [false, true] {
            let mut module = config(feature_map, causal).init::<B>(device);
            let chunks: &[usize] = if causal { &[1, 3, 4, 64] } else { &[64] };
            for &chunk in chunks {
                module.chunk_size = chunk;
                for pad in [None, Some(padding::<B>(device))] {
                    let what = format!(
                        "{feature_map} causal={causal} chunk={chunk} padded={}",
                        pad.is_some()
                    );
                    assert_close(
                        module.forward(x.clone(), pad.clone()).into_data(),
                        reference(&module, x.clone(), pad).into_data(),
                        &what,
                    );
                }
            }
            if causal {
                let mut open = module.clone();
                open.causal = false;
                let last = |y: Tensor<B, 3>| y.narrow(1, SEQ - 1, 1).into_data();
                assert_close(
                    last(module.forward(x.clone(), None)),
                    last(open.forward(x.clone(), None)),
                    &format!("{feature_map}: last causal output vs non-causal"),
                );
            }
        }
    }
    let sketched = config(FeatureMap::Softmax, true)
        .with_projections(LinearKind::Sketched {
            num_terms: 2,
            low_rank: 4,
        })
        .with_chunk_size(3)
        .init::<B>(device);
    let pad = Some(padding::<B>(device));
    assert_close(
        sketched.forward(x.clone(), pad.clone()).into_data(),
        reference(&sketched, x, pad).into_data(),
        "sketched projections",
    );
}

/// The gradients of `Σ out ⊙ g` with respect to the input and the key projection's weight
/// equal those of the quadratic form (same function, computed another way); the random
/// projection gets none.
pub fn gradients_match_reference<B: AutodiffBackend + SketchBackend>(device: &B::Device) {
    let _serial = serial();
    B::seed(device, 2);
    for feature_map in [FeatureMap::Softmax, FeatureMap::Relu] {
        for causal in [false, true] {
            let module = config(feature_map, causal)
                .with_chunk_size(3)
                .init::<B>(device);
            let x = normal::<B, 3>([2, SEQ, D_MODEL], device);
            let g = normal::<B, 3>([2, SEQ, D_MODEL], device);
            let gradients = |forward: &dyn Fn(Tensor<B, 3>) -> Tensor<B, 3>| {
                let x = x.clone().detach().require_grad();
                let grads = (forward(x.clone()) * g.clone()).sum().backward();
                let key_weight = match module.key.layer() {
                    LinearLayer::Dense(layer) => layer.weight.grad(&grads).unwrap(),
                    _ => unreachable!("dense projections"),
                };
                assert!(
                    module.projection.grad(&grads).is_none(),
                    "the random projection got a gradient"
                );
                (x.grad(&grads).unwrap(), key_weight)
            };
            let pad = padding::<B>(device);
            let (dx, dk) = gradients(&|x| module.forward(x, Some(pad.clone())));
            let (rx, rk) = gradients(&|x| reference(&module, x, Some(pad.clone())));
            let what = format!("{feature_map} causal={causal}");
            assert_close(dx.into_data(), rx.into_data(), &format!("dL/dx, {what}"));
            assert_close(dk.into_data(), rk.into_data(), &format!("dL/dWk, {what}"));
        }
    }
}

/// Changing the tokens from position 5 on leaves outputs 0..5 bit for bit as they were
/// (position 4 shares its chunk with the changed ones), and changes the later ones.
pub fn causal_outputs_ignore_the_future<B: SketchBackend>(device: &B::Device) {
    let _serial = serial();
    B::seed(device, 3);
    let (seq, cut) = (9, 5);
    for feature_map in [FeatureMap::Softmax, FeatureMap::Relu] {
        let module = config(feature_map, true)
            .with_chunk_size(4)
            .init::<B>(device);
        let x = normal::<B, 3>([2, seq, D_MODEL], device);
        // Large new tokens: under a stabiliser over the whole sequence they would move it.
        let future = normal::<B, 3>([2, seq - cut, D_MODEL], device).mul_scalar(5.0);
        let changed = Tensor::cat(vec![x.clone().narrow(1, 0, cut), future], 1);
        let (before, after) = (module.forward(x, None), module.forward(changed, None));
        assert_eq!(
            values(before.clone().narrow(1, 0, cut)),
            values(after.clone().narrow(1, 0, cut)),
            "{feature_map}: an earlier output changed"
        );
        let moved = (before.narrow(1, cut, seq - cut) - after.narrow(1, cut, seq - cut))
            .abs()
            .max()
            .into_scalar()
            .elem::<f32>();
        assert!(
            moved > 1e-3,
            "{feature_map}: later outputs did not change ({moved})"
        );
    }
}

/// Padded keys take no part: replacing the padded tokens leaves every unpadded output bit for
/// bit as it was, causal or not, and a batch padded at its end gives the outputs of its
/// unpadded prefix alone. Changing an unpadded token does change the outputs.
pub fn padded_keys_are_ignored<B: SketchBackend>(device: &B::Device) {
    let _serial = serial();
    B::seed(device, 4);
    let pad = padding::<B>(device);
    let keep = values(pad.clone().bool_not().float());
    for feature_map in [FeatureMap::Softmax, FeatureMap::Relu] {
        for causal in [false, true] {
            let what = format!("{feature_map} causal={causal}");
            let module = config(feature_map, causal)
                .with_chunk_size(3)
                .init::<B>(device);
            let x = normal::<B, 3>([2, SEQ, D_MODEL], device);
            let noise = normal::<B, 3>([2, SEQ, D_MODEL], device).mul_scalar(10.0);
            let pad_3 = pad.clone().reshape([2, SEQ, 1]).expand([2, SEQ, D_MODEL]);
            let replaced = x.clone().mask_where(pad_3, noise);
            let (a, b) = (
                values(module.forward(x.clone(), Some(pad.clone()))),
                values(module.forward(replaced, Some(pad.clone()))),
            );
            for (position, kept) in keep.iter().enumerate() {
                if *kept == 1.0 {
                    let row = position * D_MODEL..(position + 1) * D_MODEL;
                    assert_eq!(a[row.clone()], b[row], "{what}: position {position}");
                }
            }

            let alone = module.forward(x.clone().narrow(0, 0, 1).narrow(1, 0, 5), None);
            let padded = module
                .forward(x.clone(), Some(pad.clone()))
                .narrow(0, 0, 1)
                .narrow(1, 0, 5);
            assert_close(
                padded.into_data(),
                alone.into_data(),
                &format!("{what}: padded batch vs its prefix alone"),
            );

            let mut bumped = x.clone().into_data().to_vec::<f32>().unwrap();
            bumped[2 * D_MODEL] += 3.0; // batch 0, position 2: unpadded
            let bumped =
                Tensor::<B, 3>::from_data(TensorData::new(bumped, [2, SEQ, D_MODEL]), device);
            let c = values(module.forward(bumped, Some(pad.clone())));
            let last = (SEQ - 1) * D_MODEL..SEQ * D_MODEL;
            assert_ne!(
                a[last.clone()],
                c[last],
                "{what}: an unpadded key changed nothing"
            );
        }
    }
}

/// The mean relative error of the Performer built from `mha` with `m` features against
/// `mha`'s output, at each `m` of `counts`, averaged over four random projections.
fn mean_errors<B: SketchBackend>(
    mha: &AnyMultiHeadAttention<B>,
    x: Tensor<B, 3>,
    counts: &[usize],
) -> Vec<f64> {
    let softmax = mha.forward(x.clone(), None);
    let scale = softmax.clone().abs().mean().into_scalar().elem::<f64>();
    let draws = 4;
    counts
        .iter()
        .map(|&m| {
            (0..draws)
                .map(|_| {
                    let performer =
                        PerformerAttention::from_attention(mha, m, FeatureMap::Softmax).unwrap();
                    let out = performer.forward(x.clone(), None);
                    (out - softmax.clone())
                        .abs()
                        .mean()
                        .into_scalar()
                        .elem::<f64>()
                        / scale
                })
                .sum::<f64>()
                / draws as f64
        })
        .collect()
}

/// Built from our dense softmax attention, with the softmax map and modest query/key norms,
/// the Performer's mean relative error falls as the feature count grows through 16, 64, 256,
/// 1024 (as `1/√m`: eight times from the first to the last).
pub fn approaches_softmax_attention<B: SketchBackend>(device: &B::Device) {
    let _serial = serial();
    B::seed(device, 5);
    let mha = AnyMultiHeadAttentionConfig::new(16, 2).init::<B>(device);
    let x = normal::<B, 3>([2, 24, 16], device);
    let counts = [16, 64, 256, 1024];
    let errors = mean_errors(&mha, x, &counts);
    eprintln!("mean relative error at m = {counts:?}: {errors:.4?}");
    for pair in errors.windows(2) {
        assert!(pair[1] < pair[0], "the error did not fall: {errors:?}");
    }
    assert!(
        errors[3] < errors[0] / 3.0,
        "the error fell too little: {errors:?}"
    );
}

/// From our dense attention (causal and not) and from Burn's, the Performer keeps the
/// projections as they are and, with 4096 features, stays within 8 % of the softmax module's
/// output (mean relative error, averaged over four random projections: the estimator is
/// heavy-tailed, one draw in a few puts a query or two off by more; 1.8 to 4.7 % measured).
pub fn built_from_dense_attention<B: SketchBackend>(device: &B::Device) {
    let _serial = serial();
    B::seed(device, 6);
    let x = normal::<B, 3>([2, 16, 16], device);
    let draws = 4;
    let mean_error = |performers: Vec<PerformerAttention<B>>,
                      pad: Option<Tensor<B, 2, Bool>>,
                      softmax: Tensor<B, 3>| {
        let scale = softmax.clone().abs().mean().into_scalar().elem::<f64>();
        performers
            .iter()
            .map(|p| {
                let out = p.forward(x.clone(), pad.clone());
                (out - softmax.clone())
                    .abs()
                    .mean()
                    .into_scalar()
                    .elem::<f64>()
                    / scale
            })
            .sum::<f64>()
            / performers.len() as f64
    };
    for causal in [false, true] {
        let mha = AnyMultiHeadAttentionConfig::new(16, 2)
            .with_causal(causal)
            .init::<B>(device);
        let performers = (0..draws)
            .map(|_| PerformerAttention::from_attention(&mha, 4096, FeatureMap::Softmax).unwrap())
            .collect::<Vec<_>>();
        let performer = &performers[0];
        assert_eq!(performer.causal, causal);
        assert_eq!(performer.n_heads, 2);
        for (ours, theirs) in [
            (&performer.query, &mha.query),
            (&performer.key, &mha.key),
            (&performer.value, &mha.value),
            (&performer.output, &mha.output),
        ] {
            assert_eq!(
                values(ours.to_dense_weight()),
                values(theirs.to_dense_weight())
            );
        }
        let pad = padding_16::<B>(device);
        let softmax = mha.forward(x.clone(), Some(pad.clone()));
        let error = mean_error(performers, Some(pad), softmax);
        eprintln!("ours, causal={causal}: mean relative error {error:.4}");
        assert!(error < 0.08, "causal={causal}: relative error {error}");
    }

    let burn_mha = BurnMhaConfig::new(16, 2)
        .with_dropout(0.0)
        .init::<B>(device);
    let performers = (0..draws)
        .map(|_| {
            PerformerAttention::from_burn(&burn_mha, 4096, FeatureMap::Softmax, false).unwrap()
        })
        .collect::<Vec<_>>();
    assert_eq!(
        values(performers[0].output.to_dense_weight()),
        values(burn_mha.output.weight.val())
    );
    let softmax = burn_mha.forward(MhaInput::self_attn(x.clone())).context;
    let error = mean_error(performers, None, softmax);
    eprintln!("Burn's: mean relative error {error:.4}");
    assert!(error < 0.08, "Burn's attention: relative error {error}");

    let err = PerformerAttention::from_attention(
        &AnyMultiHeadAttentionConfig::new(16, 2).init::<B>(device),
        0,
        FeatureMap::Relu,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CompressError::InvalidConfig {
                name: "num_features",
                ..
            }
        ),
        "{err}"
    );
}

fn padding_16<B: Backend>(device: &B::Device) -> Tensor<B, 2, Bool> {
    let mut rows = [[false; 16]; 2];
    rows[0][13..].fill(true);
    rows[1][4] = true;
    pad_mask(&[&rows[0], &rows[1]], device)
}

/// A record holds everything, the random projection included: a module built with another
/// seed and loaded from it computes the same outputs, bit for bit.
pub fn record_round_trip_is_exact<B: SketchBackend>(device: &B::Device) {
    let _serial = serial();
    for causal in [false, true] {
        B::seed(device, 7);
        let module = config(FeatureMap::Softmax, causal).init::<B>(device);
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = recorder.record(module.clone().into_record(), ()).unwrap();
        B::seed(device, 8);
        let other = config(FeatureMap::Softmax, causal).init::<B>(device);
        assert_ne!(
            values(other.projection.val()),
            values(module.projection.val())
        );
        let loaded = other.load_record(recorder.load(bytes, device).unwrap());
        assert_eq!(
            values(loaded.projection.val()),
            values(module.projection.val())
        );
        let x = normal::<B, 3>([2, SEQ, D_MODEL], device);
        assert_eq!(
            values(loaded.forward(x.clone(), None)),
            values(module.forward(x, None)),
            "causal={causal}"
        );
    }
}

/// `B::seed` before `init` fixes the whole module; another seed gives another projection.
/// Within each block of `d_head` rows the projection's rows are orthogonal, and their lengths
/// vary (independent Gaussian norms, not a constant).
pub fn init_is_seeded_and_orthogonal<B: SketchBackend>(device: &B::Device) {
    let _serial = serial();
    let init = |seed| {
        B::seed(device, seed);
        config(FeatureMap::Softmax, false).init::<B>(device)
    };
    let (a, b, c) = (init(9), init(9), init(10));
    assert_eq!(values(a.projection.val()), values(b.projection.val()));
    assert_eq!(
        values(a.query.to_dense_weight()),
        values(b.query.to_dense_weight())
    );
    assert_ne!(values(a.projection.val()), values(c.projection.val()));

    let d_head = D_MODEL / HEADS;
    let w = values(a.projection.val());
    let row = |i: usize| &w[i * d_head..(i + 1) * d_head];
    let dot = |i: usize, j: usize| -> f64 {
        row(i)
            .iter()
            .zip(row(j))
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    };
    let norms = (0..FEATURES).map(|i| dot(i, i).sqrt()).collect::<Vec<_>>();
    for i in 0..FEATURES {
        for j in 0..i {
            if i / d_head == j / d_head {
                let cosine = dot(i, j) / (norms[i] * norms[j]);
                assert!(cosine.abs() < 1e-5, "rows {i} and {j}: cosine {cosine}");
            }
        }
    }
    let (low, high) = norms
        .iter()
        .fold((f64::MAX, 0f64), |(l, h), n| (l.min(*n), h.max(*n)));
    assert!(high - low > 1e-2, "row lengths all equal: {norms:?}");
}

/// An optimizer step moves the projections' weights and leaves the random projection alone.
pub fn projection_is_not_trained<B: AutodiffBackend + SketchBackend>(device: &B::Device) {
    let _serial = serial();
    B::seed(device, 11);
    let module = config(FeatureMap::Softmax, true).init::<B>(device);
    let before = values(module.projection.val());
    let query_before = values(module.query.to_dense_weight());
    let x = normal::<B, 3>([2, SEQ, D_MODEL], device);
    let grads = module.forward(x, None).powi_scalar(2).sum().backward();
    assert!(module.projection.grad(&grads).is_none());
    let grads = GradientsParams::from_grads(grads, &module);
    let mut optimizer = AdamConfig::new().init();
    let module = optimizer.step(1e-2, module, grads);
    assert_eq!(values(module.projection.val()), before);
    assert_ne!(values(module.query.to_dense_weight()), query_before);

    // Still fixed after a record round trip.
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(module.clone().into_record(), ()).unwrap();
    let loaded = config(FeatureMap::Softmax, true)
        .init::<B>(device)
        .load_record(recorder.load(bytes, device).unwrap());
    let x = normal::<B, 3>([2, SEQ, D_MODEL], device);
    let grads = loaded.forward(x, None).sum().backward();
    assert!(loaded.projection.grad(&grads).is_none());
    assert!(loaded.value.to_dense_weight().grad(&grads).is_some());
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A tensor of `performer.safetensors`, as written.
fn fixture_tensor<B: Backend, const D: usize>(name: &str, device: &B::Device) -> Tensor<B, D> {
    let bytes = std::fs::read(fixture("performer.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(name).unwrap();
    let data = view
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(data, view.shape().to_vec()), device)
}

fn fixture_config(feature_map: FeatureMap, causal: bool) -> PerformerAttentionConfig {
    PerformerAttentionConfig::new(8, 2)
        .with_num_features(6)
        .with_feature_map(feature_map)
        .with_causal(causal)
        .with_chunk_size(2)
}

/// The fixture's state dict, read from its safetensors and its `torch.save` file, gives the
/// outputs of Panther's forward pass (numpy, float64): to f32 precision for every
/// non-causal module and the causal ReLU one. The causal softmax module differs from Panther
/// by design (Panther stabilises every key by a maximum over the whole sequence, later
/// positions included, so its earlier outputs depend on later tokens through `ε`): its last
/// output, whose prefix is the whole sequence, matches to f32 precision, the others to `ε`'s
/// order. The weights are read transposed from PyTorch's `[out, in]`.
pub fn panther_fixture_matches_panther_math<B: SketchBackend>(device: &B::Device) {
    let x = fixture_tensor::<B, 3>("expected.x", device);
    for file in ["performer.safetensors", "performer.pt"] {
        for feature_map in [FeatureMap::Softmax, FeatureMap::Relu] {
            for causal in [false, true] {
                let what = format!("{file}, {feature_map} causal={causal}");
                let module = load_performer::<B>(
                    &fixture(file),
                    "attn.",
                    &fixture_config(feature_map, causal),
                    device,
                )
                .unwrap_or_else(|err| panic!("{what}: {err}"));
                let name = format!(
                    "expected.{feature_map}{}",
                    if causal { "_causal" } else { "" }
                );
                let expected = fixture_tensor::<B, 3>(&name, device);
                let out = module.forward(x.clone(), None);
                if causal && feature_map == FeatureMap::Softmax {
                    let last = |y: Tensor<B, 3>| y.narrow(1, 4, 1).into_data();
                    assert_close(last(out.clone()), last(expected.clone()), &what);
                    let scale = expected.clone().abs().max().into_scalar().elem::<f32>();
                    let gap = (out - expected).abs().max().into_scalar().elem::<f32>();
                    eprintln!("{what}: largest gap to Panther's output {gap:.2e} (scale {scale})");
                    assert!(gap < 1e-3 * scale, "{what}: {gap}");
                } else {
                    assert_close(out.into_data(), expected.into_data(), &what);
                }
                let wq = fixture_tensor::<B, 2>("attn.Wq", device);
                assert_eq!(
                    values(module.query.to_dense_weight()),
                    values(wq.transpose())
                );
            }
        }
    }
}

/// A Panther state dict of `d_model` 8, 2 heads, 6 features, under `attn.`; the biases
/// optional.
fn panther_tensors(bias: bool) -> Vec<(String, Vec<usize>, Dtype, Vec<u8>)> {
    let mut tensors = vec![];
    let f32_bytes = |len: usize| {
        (0..len)
            .flat_map(|i| ((i % 7) as f32 * 0.1 - 0.3).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    for name in ["Wq", "Wk", "Wv", "W0"] {
        tensors.push((
            format!("attn.{name}"),
            vec![8, 8],
            Dtype::F32,
            f32_bytes(64),
        ));
    }
    if bias {
        for name in ["bq", "bk", "bv", "b0"] {
            tensors.push((format!("attn.{name}"), vec![8], Dtype::F32, f32_bytes(8)));
        }
    }
    tensors.push((
        "attn.projection_matrix".into(),
        vec![6, 4],
        Dtype::F32,
        f32_bytes(24),
    ));
    tensors
}

fn safetensors_bytes(tensors: &[(String, Vec<usize>, Dtype, Vec<u8>)]) -> Vec<u8> {
    let views = tensors
        .iter()
        .map(|(name, shape, dtype, bytes)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect::<Vec<_>>();
    safetensors::serialize(views, None).unwrap()
}

/// Every way a checkpoint can fail to fit is a typed error naming the tensor.
#[test]
fn bad_panther_checkpoints_are_typed_errors() {
    type B = burn::backend::NdArray;
    let device = Default::default();
    let config = fixture_config(FeatureMap::Softmax, false);
    let load = |tensors: &[(String, Vec<usize>, Dtype, Vec<u8>)],
                config: &PerformerAttentionConfig| {
        load_performer_from_bytes::<B>(&safetensors_bytes(tensors), "attn.", config, &device)
    };

    let module = load(&panther_tensors(true), &config).unwrap();
    assert!(module.query.has_bias());
    let module = load(&panther_tensors(false), &config).unwrap();
    assert!(!module.output.has_bias());
    let sketched = config.clone().with_projections(LinearKind::Sketched {
        num_terms: 1,
        low_rank: 2,
    });
    let module = load(&panther_tensors(true), &sketched).unwrap();
    assert_eq!(module.value.kind(), sketched.projections);

    let missing = |err: CompressError, want: &str| match err {
        CompressError::Sketch(SketchError::MissingKey { key }) => assert_eq!(key, want),
        other => panic!("expected MissingKey {want}, got {other}"),
    };
    let mismatch = |err: CompressError, want: &str| match err {
        CompressError::Sketch(SketchError::ShapeMismatch { key, .. }) => assert_eq!(key, want),
        other => panic!("expected ShapeMismatch {want}, got {other}"),
    };
    let without = |name: &str| {
        let mut tensors = panther_tensors(true);
        tensors.retain(|t| t.0 != name);
        tensors
    };
    missing(load(&without("attn.Wv"), &config).unwrap_err(), "attn.Wv");
    missing(
        load(&without("attn.projection_matrix"), &config).unwrap_err(),
        "attn.projection_matrix",
    );
    // One bias present means all four.
    missing(load(&without("attn.bk"), &config).unwrap_err(), "attn.bk");

    let reshaped = |name: &str, shape: Vec<usize>| {
        let mut tensors = panther_tensors(true);
        let entry = tensors.iter_mut().find(|t| t.0 == name).unwrap();
        let len = shape.iter().product::<usize>();
        entry.3 = vec![0; 4 * len];
        entry.1 = shape;
        tensors
    };
    mismatch(
        load(&reshaped("attn.Wq", vec![8, 4]), &config).unwrap_err(),
        "attn.Wq",
    );
    mismatch(
        load(&reshaped("attn.b0", vec![4]), &config).unwrap_err(),
        "attn.b0",
    );
    // An SRPE module's projection has num_realizations columns, not d_head.
    mismatch(
        load(&reshaped("attn.projection_matrix", vec![6, 16]), &config).unwrap_err(),
        "attn.projection_matrix",
    );
    // The file and the configuration disagree.
    let tensors = panther_tensors(true);
    mismatch(
        load(
            &tensors,
            &PerformerAttentionConfig {
                d_model: 16,
                ..config.clone()
            },
        )
        .unwrap_err(),
        "attn.Wq",
    );
    mismatch(
        load(&tensors, &config.clone().with_num_features(7)).unwrap_err(),
        "attn.projection_matrix",
    );
    mismatch(
        load(
            &tensors,
            &PerformerAttentionConfig {
                n_heads: 4,
                ..config.clone()
            },
        )
        .unwrap_err(),
        "attn.projection_matrix",
    );
    let err = load(
        &tensors,
        &PerformerAttentionConfig {
            n_heads: 3,
            ..config.clone()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CompressError::InvalidConfig {
                name: "n_heads",
                ..
            }
        ),
        "{err}"
    );
    let low_rank = config
        .clone()
        .with_projections(LinearKind::LowRank { rank: 2 });
    let err = load(&tensors, &low_rank).unwrap_err();
    assert!(matches!(err, CompressError::Unsupported { .. }), "{err}");

    let mut ints = panther_tensors(true);
    ints[0].2 = Dtype::I32;
    let err = load(&ints, &config).unwrap_err();
    assert!(
        matches!(&err, CompressError::Sketch(SketchError::UnsupportedDtype { key, .. }) if key == "attn.Wq"),
        "{err}"
    );

    let err =
        load_performer_from_bytes::<B>(b"not a checkpoint", "attn.", &config, &device).unwrap_err();
    assert!(
        matches!(err, CompressError::Sketch(SketchError::Format { .. })),
        "{err}"
    );
    let err = load_performer::<B>(&fixture("absent.pt"), "attn.", &config, &device).unwrap_err();
    assert!(
        matches!(err, CompressError::Sketch(SketchError::Io { .. })),
        "{err}"
    );
    missing(
        load_performer::<B>(&fixture("performer.pt"), "encoder.", &config, &device).unwrap_err(),
        "encoder.Wq",
    );
}

/// Invalid configurations are errors naming the value.
#[test]
fn invalid_configs_are_errors() {
    type B = burn::backend::NdArray;
    let device = Default::default();
    let base = PerformerAttentionConfig::new(8, 2);
    let name = |config: PerformerAttentionConfig| match config.try_init::<B>(&device) {
        Err(CompressError::InvalidConfig { name, .. }) => name,
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("accepted"),
    };
    assert_eq!(
        name(PerformerAttentionConfig {
            n_heads: 3,
            ..base.clone()
        }),
        "n_heads"
    );
    assert_eq!(
        name(PerformerAttentionConfig {
            n_heads: 0,
            ..base.clone()
        }),
        "n_heads"
    );
    assert_eq!(name(base.clone().with_num_features(0)), "num_features");
    assert_eq!(name(base.clone().with_chunk_size(0)), "chunk_size");
    assert_eq!(name(PerformerAttentionConfig::new(0, 1)), "d_model");
    for epsilon in [-1e-5, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            base.clone()
                .with_kernel_epsilon(epsilon)
                .try_init::<B>(&device),
            Err(CompressError::Unsupported { .. })
        ));
    }
    assert!(base.try_init::<B>(&device).is_ok());
}
