//! Attention's softmax pass compiled for AVX-512: the one `#[target_feature]` function of
//! [`attention`](crate::attention), around its portable loop.

use crate::attention::Step;
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
