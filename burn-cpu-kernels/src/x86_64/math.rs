//! The element-wise functions compiled for AVX-512 with fused multiply-adds: [`crate::math`]'s
//! maps and [`Activation`]'s forward and backward. Each wrapper is the module's portable
//! generic body with `FMA = true`, compiled here with the target features so that its loop
//! runs sixteen lanes wide; the polynomials are the same code on both paths.

use crate::Activation;
use crate::math::Func;

/// `crate::math::map_each` compiled for AVX-512 with fused multiply-adds.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and DQ and FMA: call only where
/// [`Isa::avx512`](crate::Isa::avx512) holds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn map_avx512(func: Func, src: Option<&[f32]>, dst: &mut [f32]) {
    crate::math::map_each::<true>(func, src, dst);
}

/// [`Activation::apply_to`] compiled for AVX-512: sixteen values per instruction.
///
/// # Safety
/// As [`map_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn apply_to_avx512(activation: Activation, values: &mut [f32]) {
    crate::activation::apply_each::<true>(activation, values);
}

/// [`Activation::backward_to`] compiled for AVX-512.
///
/// # Safety
/// As [`map_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn backward_avx512(activation: Activation, kept: &[f32], grad: &mut [f32]) {
    crate::activation::backward_each::<true>(activation, kept, grad);
}
