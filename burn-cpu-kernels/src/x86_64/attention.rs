//! Attention's element-wise passes compiled for AVX-512, around their portable loops: the
//! forward's softmax and the backward's probabilities and score gradients.

use crate::attention::{BackStep, Step};
use crate::convert::StoredFloat;

/// [`Step::softmax_rows`] compiled for AVX-512: sixteen scores per instruction, the
/// polynomials in fused multiply-adds.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL, DQ and FMA (what [`Isa::avx512`](crate::Isa::avx512) holds for).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn softmax_rows<E: StoredFloat>(
    step: &Step<'_, '_, E>,
    scores: &mut [f32],
    acc: &mut [f32],
    maxes: &mut [f32],
    sums: &mut [f32],
) {
    step.softmax_rows::<true>(scores, acc, maxes, sums);
}

/// [`BackStep::grad_rows`] compiled for AVX-512: the backward's recomputed probabilities
/// `exp(s − lse)` and score gradients sixteen per instruction, the polynomials in fused
/// multiply-adds.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL, DQ and FMA (what [`Isa::avx512`](crate::Isa::avx512) holds for).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn grad_rows<E: StoredFloat>(
    step: &BackStep<'_, '_, E>,
    scores: &mut [f32],
    grads: &mut [f32],
    cap_grad: &mut [f32],
) {
    step.grad_rows::<true>(scores, grads, cap_grad);
}
