//! One-pass conversions between `f32` and the half-precision types, on a tensor's buffer.
//!
//! `bf16` is the top half of an `f32`: widening is a shift, narrowing rounds to nearest with
//! ties to even (NaN stays NaN), the rounding of `half::bf16::from_f32`, written without
//! branches so that the loop compiles to AVX-512 selects. `f16` uses `half`'s slice
//! conversions (F16C's vector instructions where the CPU has them).

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use burn_cpu_kernels::Isa;

/// Values per thread's piece of a conversion: below two pieces, one thread converts it all.
const PIECE: usize = 1 << 16;

/// A half-precision type this module converts.
pub(super) trait Half: burn::tensor::Element + bytemuck::Pod {
    const DTYPE: DType;
    const ZERO: Self;
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Half for bf16 {
    const DTYPE: DType = DType::BF16;
    const ZERO: Self = bf16::ZERO;
    fn widen(src: &[Self], dst: &mut [f32]) {
        bf16_to_f32(src, dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        f32_to_bf16(src, dst);
    }
}

impl Half for f16 {
    const DTYPE: DType = DType::F16;
    const ZERO: Self = f16::ZERO;
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

/// `dst[i] = src[i]` as `f32` (exact).
///
/// # Panics
/// If the slices differ in length.
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "one f32 per bf16");
    #[cfg(target_arch = "x86_64")]
    if Isa::detected().avx512() {
        // SAFETY: AVX-512F was detected.
        unsafe { bf16_to_f32_avx512(src, dst) };
        return;
    }
    widen_each(src, dst);
}

/// `dst[i] = src[i]` rounded to `bf16`: to nearest, ties to even, NaN kept (bit for bit
/// `half::bf16::from_f32`).
///
/// # Panics
/// If the slices differ in length.
pub fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "one bf16 per f32");
    #[cfg(target_arch = "x86_64")]
    if Isa::detected().avx512() {
        // SAFETY: AVX-512F was detected.
        unsafe { f32_to_bf16_avx512(src, dst) };
        return;
    }
    narrow_each(src, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn bf16_to_f32_avx512(src: &[bf16], dst: &mut [f32]) {
    widen_each(src, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn f32_to_bf16_avx512(src: &[f32], dst: &mut [bf16]) {
    narrow_each(src, dst);
}

#[inline(always)]
fn widen_each(src: &[bf16], dst: &mut [f32]) {
    for (out, value) in dst.iter_mut().zip(src) {
        *out = f32::from_bits(u32::from(value.to_bits()) << 16);
    }
}

#[inline(always)]
fn narrow_each(src: &[f32], dst: &mut [bf16]) {
    for (out, value) in dst.iter_mut().zip(src) {
        let bits = value.to_bits();
        let nan = bits & 0x7fff_ffff > 0x7f80_0000;
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
        let quiet = (bits >> 16) | 0x0040;
        *out = bf16::from_bits(if nan { quiet } else { rounded } as u16);
    }
}

/// The range of `layout`'s buffer its elements lie in, where that range holds no element
/// outside the view (a contiguous, permuted or broadcast layout): converting it converts the
/// view, and the layout, moved to offset 0, still describes it.
fn dense_span(layout: &Layout) -> Option<(usize, usize)> {
    let (shape, strides) = (layout.shape(), layout.strides());
    if shape.num_elements() == 0 || strides.iter().any(|&s| s < 0) {
        return None;
    }
    let reach: usize = (0..shape.num_dims())
        .map(|d| (shape[d] - 1) * strides[d] as usize)
        .sum();
    let start = layout.start_offset();
    (reach < shape.num_elements()).then_some((start, start + reach + 1))
}

/// The tensor's buffer range to convert and the layout of the converted values.
fn source(tensor: &FlexTensor) -> (FlexTensor, usize, usize, Layout) {
    let layout = tensor.layout();
    match dense_span(layout) {
        Some((start, end)) => {
            let moved = Layout::new(layout.shape().clone(), layout.strides().to_vec(), 0);
            (tensor.clone(), start, end, moved)
        }
        None => {
            let contiguous = super::copy::contiguous(tensor);
            let start = contiguous.layout().start_offset();
            let end = start + contiguous.layout().num_elements();
            let moved = Layout::contiguous(contiguous.layout().shape().clone());
            (contiguous, start, end, moved)
        }
    }
}

/// `f(src, dst)` over matching pieces of `piece` values of both slices, on rayon's threads
/// when there are two pieces or more (below that, one thread does it all).
pub(super) fn in_pieces<S: Sync, D: Send>(
    src: &[S],
    dst: &mut [D],
    piece: usize,
    f: impl Fn(&[S], &mut [D]) + Sync,
) {
    if src.len() < 2 * piece {
        f(src, dst);
    } else {
        dst.par_chunks_mut(piece)
            .zip(src.par_chunks(piece))
            .for_each(|(dst, src)| f(src, dst));
    }
}

/// A `bf16` or `f16` tensor as `f32`.
pub(super) fn widen<H: Half>(tensor: &FlexTensor) -> FlexTensor {
    let (tensor, start, end, layout) = source(tensor);
    let src = &tensor.storage::<H>()[start..end];
    let mut values = vec![0.0f32; src.len()];
    in_pieces(src, &mut values, PIECE, H::widen);
    FlexTensor::new(Bytes::from_elems(values), layout, DType::F32)
}

/// An `f32` tensor rounded to `H`.
pub(super) fn narrow<H: Half>(tensor: &FlexTensor) -> FlexTensor {
    let (tensor, start, end, layout) = source(tensor);
    let src = &tensor.storage::<f32>()[start..end];
    let mut values = vec![H::ZERO; src.len()];
    in_pieces(src, &mut values, PIECE, H::narrow);
    FlexTensor::new(Bytes::from_elems(values), layout, H::DTYPE)
}
