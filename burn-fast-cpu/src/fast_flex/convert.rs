//! One-pass conversions of a tensor between `f32` and the half-precision types, on
//! [`burn_cpu_kernels::convert`]'s slice conversions (`bf16` vectorised, `f16` `half`'s),
//! rayon's threads sharing a large tensor.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::Bytes;
use burn_cpu_kernels::convert::HalfFloat;
use half::{bf16, f16};
use rayon::prelude::*;

use crate::flex_view::{self, FlexFloat};

/// Values per thread's piece of a conversion: below two pieces, one thread converts it all.
const PIECE: usize = 1 << 16;

/// A half-precision type a tensor holds: `bf16` or `f16`.
pub(super) trait Half: FlexFloat + HalfFloat {}
impl Half for bf16 {}
impl Half for f16 {}

/// The tensor's buffer range to convert and the layout of the converted values: the range
/// its elements lie in ([`flex_view::dense_span`]), or a contiguous copy's.
fn source(tensor: &FlexTensor) -> (FlexTensor, std::ops::Range<usize>, Layout) {
    let layout = tensor.layout();
    match flex_view::dense_span(layout) {
        Some(span) => {
            let moved = Layout::new(layout.shape().clone(), layout.strides().to_vec(), 0);
            (tensor.clone(), span, moved)
        }
        None => {
            let contiguous = flex_view::contiguous(tensor);
            let start = contiguous.layout().start_offset();
            let end = start + contiguous.layout().num_elements();
            let moved = Layout::contiguous(contiguous.layout().shape().clone());
            (contiguous, start..end, moved)
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
    let (tensor, span, layout) = source(tensor);
    let src = &tensor.storage::<H>()[span];
    let mut values = vec![0.0f32; src.len()];
    in_pieces(src, &mut values, PIECE, H::widen);
    FlexTensor::new(Bytes::from_elems(values), layout, f32::DTYPE)
}

/// An `f32` tensor rounded to `H`.
pub(super) fn narrow<H: Half>(tensor: &FlexTensor) -> FlexTensor {
    let (tensor, span, layout) = source(tensor);
    let src = &tensor.storage::<f32>()[span];
    let mut values = vec![H::default(); src.len()];
    in_pieces(src, &mut values, PIECE, H::narrow);
    FlexTensor::new(Bytes::from_elems(values), layout, H::DTYPE)
}
