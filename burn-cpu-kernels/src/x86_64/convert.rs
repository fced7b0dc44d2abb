//! The `f32` ↔ `bf16` slice conversions compiled for AVX-512: [`crate::convert`]'s portable
//! loops, written without branches, compiled here with the target features so that each runs
//! sixteen lanes wide (the NaN case a select).

use half::bf16;

/// `crate::convert::widen_each` compiled for AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F and BW: call only where [`Isa::avx512`](crate::Isa::avx512)
/// holds.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    crate::convert::widen_each(src, dst);
}

/// `crate::convert::narrow_each` compiled for AVX-512.
///
/// # Safety
/// As [`bf16_to_f32`].
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    crate::convert::narrow_each(src, dst);
}
