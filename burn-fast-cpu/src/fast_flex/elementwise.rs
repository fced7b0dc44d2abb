//! Element-wise operations on vectorised `f32` slice kernels, in every float type but `f64`:
//! `f32` tensors are read in place, `bf16` and `f16` ones are widened a piece at a time into a
//! scratch that stays in cache, computed, and rounded once into the output.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType};
use half::{bf16, f16};
use rayon::prelude::*;

use burn_cpu_kernels::{Activation, math};

use super::convert::{Half, in_pieces};

/// Values per piece: small enough for a piece and its scratch to stay in L2, large enough to
/// amortise rayon's scheduling.
const PIECE: usize = 1 << 14;

/// `op` applied in place to every value of `tensor` (as `f32`), in its own buffer when no
/// other tensor shares it (an activation after a layer: no allocation, no page faults), or
/// `Err(tensor)` for a type this module does not compute (`f64`: Flex's own operation runs).
pub(super) fn unary(
    tensor: FlexTensor,
    op: impl Fn(&mut [f32]) + Sync,
) -> Result<FlexTensor, FlexTensor> {
    let dtype = tensor.dtype();
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(tensor);
    }
    let mut tensor = if tensor.layout().is_contiguous() {
        tensor
    } else {
        super::copy::contiguous(&tensor)
    };
    let start = tensor.layout().start_offset();
    let len = tensor.layout().num_elements();
    let in_place = match dtype {
        DType::F32 => tensor.try_storage_mut::<f32>().map(|values| {
            let values = &mut values[start..start + len];
            pieces_in_place(values, |piece| op(piece));
        }),
        DType::BF16 => tensor
            .try_storage_mut::<bf16>()
            .map(|values| half_in_place(&mut values[start..start + len], &op)),
        _ => tensor
            .try_storage_mut::<f16>()
            .map(|values| half_in_place(&mut values[start..start + len], &op)),
    };
    if in_place.is_some() {
        return Ok(tensor);
    }
    let layout = moved(tensor.layout());
    Ok(match dtype {
        DType::F32 => {
            let src = &tensor.storage::<f32>()[start..start + len];
            let mut out = vec![0.0f32; len];
            in_pieces(src, &mut out, PIECE, |src, dst| {
                dst.copy_from_slice(src);
                op(dst);
            });
            FlexTensor::new(Bytes::from_elems(out), layout, DType::F32)
        }
        DType::BF16 => {
            half_unary::<bf16>(&tensor.storage::<bf16>()[start..start + len], layout, &op)
        }
        _ => half_unary::<f16>(&tensor.storage::<f16>()[start..start + len], layout, &op),
    })
}

/// `op` on a copy of half values, a piece at a time through an `f32` scratch.
fn half_unary<H: Half>(src: &[H], layout: Layout, op: &(impl Fn(&mut [f32]) + Sync)) -> FlexTensor {
    let mut out = vec![H::ZERO; src.len()];
    in_pieces(src, &mut out, PIECE, |src, dst| {
        let mut scratch = vec![0.0f32; src.len()];
        H::widen(src, &mut scratch);
        op(&mut scratch);
        H::narrow(&scratch, dst);
    });
    FlexTensor::new(Bytes::from_elems(out), layout, H::DTYPE)
}

/// `op` on half values in place, a piece at a time through an `f32` scratch.
fn half_in_place<H: Half>(values: &mut [H], op: &(impl Fn(&mut [f32]) + Sync)) {
    pieces_in_place(values, |piece| {
        let mut scratch = vec![0.0f32; piece.len()];
        H::widen(piece, &mut scratch);
        op(&mut scratch);
        H::narrow(&scratch, piece);
    });
}

/// `f` over pieces of `values`, on rayon's threads when there are several.
fn pieces_in_place<T: Send>(values: &mut [T], f: impl Fn(&mut [T]) + Sync) {
    if values.len() <= PIECE {
        f(values);
    } else {
        values.par_chunks_mut(PIECE).for_each(&f);
    }
}

/// `op(a, b)` with `b` updated in place, over two tensors of one shape and type; `None`
/// where the shapes or types differ or the type is `f64`.
pub(super) fn binary(
    a: &FlexTensor,
    b: &FlexTensor,
    op: impl Fn(&[f32], &mut [f32]) + Sync,
) -> Option<FlexTensor> {
    if a.layout().shape() != b.layout().shape() || a.dtype() != b.dtype() {
        return None;
    }
    let (a, b) = (super::copy::contiguous(a), super::copy::contiguous(b));
    let layout = Layout::contiguous(a.layout().shape().clone());
    let len = layout.num_elements();
    let (sa, sb) = (a.layout().start_offset(), b.layout().start_offset());
    Some(match a.dtype() {
        DType::F32 => {
            let (x, y) = (
                &a.storage::<f32>()[sa..sa + len],
                &b.storage::<f32>()[sb..sb + len],
            );
            let mut out = vec![0.0f32; len];
            out.par_chunks_mut(PIECE)
                .zip(x.par_chunks(PIECE).zip(y.par_chunks(PIECE)))
                .for_each(|(dst, (x, y))| {
                    dst.copy_from_slice(y);
                    op(x, dst);
                });
            FlexTensor::new(Bytes::from_elems(out), layout, DType::F32)
        }
        DType::BF16 => half_binary::<bf16>(
            &a.storage::<bf16>()[sa..sa + len],
            &b.storage::<bf16>()[sb..sb + len],
            layout,
            &op,
        ),
        DType::F16 => half_binary::<f16>(
            &a.storage::<f16>()[sa..sa + len],
            &b.storage::<f16>()[sb..sb + len],
            layout,
            &op,
        ),
        _ => return None,
    })
}

fn half_binary<H: Half>(
    x: &[H],
    y: &[H],
    layout: Layout,
    op: &(impl Fn(&[f32], &mut [f32]) + Sync),
) -> FlexTensor {
    let mut out = vec![H::ZERO; x.len()];
    out.par_chunks_mut(PIECE)
        .zip(x.par_chunks(PIECE).zip(y.par_chunks(PIECE)))
        .for_each(|(dst, (x, y))| {
            let (mut a, mut b) = (vec![0.0f32; x.len()], vec![0.0f32; y.len()]);
            H::widen(x, &mut a);
            H::widen(y, &mut b);
            op(&a, &mut b);
            H::narrow(&b, dst);
        });
    FlexTensor::new(Bytes::from_elems(out), layout, H::DTYPE)
}

/// A contiguous layout of `layout`'s shape (the output's).
fn moved(layout: &Layout) -> Layout {
    Layout::contiguous(layout.shape().clone())
}

/// The exact GELU (Burn's `gelu`), on [`math::gelu_in_place`] (`erf` within 1 ulp).
pub(super) fn gelu(tensor: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    unary(tensor, math::gelu_in_place)
}

/// `eˣ` on [`math::exp_in_place`] (within 1 ulp).
pub(super) fn exp(tensor: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    unary(tensor, math::exp_in_place)
}

/// `erf` on [`math::erf_in_place`] (within 1 ulp).
pub(super) fn erf(tensor: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    unary(tensor, math::erf_in_place)
}

/// `tanh` on [`math::tanh_in_place`] (within 1.1 ulp).
pub(super) fn tanh(tensor: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    unary(tensor, math::tanh_in_place)
}

/// GELU's backward, `grad · gelu'(x)`.
pub(super) fn gelu_backward(x: &FlexTensor, grad: &FlexTensor) -> Option<FlexTensor> {
    binary(x, grad, |x, grad| Activation::Gelu.backward_to(x, grad))
}
