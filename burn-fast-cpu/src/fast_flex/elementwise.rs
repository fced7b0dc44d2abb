//! Element-wise operations on vectorised `f32` slice kernels, in every float type but `f64`:
//! `f32` tensors are read in place, `bf16` and `f16` ones are widened a chunk at a time into
//! a scratch that stays in cache, computed, and rounded once into the output
//! ([`through_f32`]).

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use burn_cpu_kernels::convert::through_f32;
use half::{bf16, f16};
use rayon::prelude::*;

use burn_cpu_kernels::{Activation, math};

use super::FastPath;
use super::convert::{Half, in_pieces};
use crate::flex_view::{self, FlexFloat};

/// Values per piece: small enough for a piece to stay in L2 between its copy and the
/// operation, large enough to amortise rayon's scheduling.
const PIECE: usize = 1 << 14;

/// `op` applied in place to every value of `tensor` (as `f32`), in its own buffer when no
/// other tensor shares it (an activation after a layer: no allocation, no page faults); a
/// type this module does not compute (`f64`) comes back as the `Err`.
pub(super) fn unary(tensor: FlexTensor, op: impl Fn(&mut [f32]) + Sync) -> FastPath<FlexTensor> {
    match tensor.dtype() {
        DType::F32 => Ok(unary_in::<f32>(tensor, &op)),
        DType::BF16 => Ok(unary_in::<bf16>(tensor, |piece| through_f32(piece, &op))),
        DType::F16 => Ok(unary_in::<f16>(tensor, |piece| through_f32(piece, &op))),
        _ => Err(tensor),
    }
}

/// `f` over pieces of `tensor`'s values: in its own buffer where no other tensor shares it,
/// else over a copy.
fn unary_in<E: FlexFloat>(tensor: FlexTensor, f: impl Fn(&mut [E]) + Sync) -> FlexTensor {
    let mut tensor = if tensor.layout().is_contiguous() {
        tensor
    } else {
        flex_view::contiguous(&tensor)
    };
    if let Some(values) = flex_view::values_mut::<E>(&mut tensor) {
        pieces_in_place(values, &f);
        return tensor;
    }
    let src = flex_view::values::<E>(&tensor).expect("contiguous");
    let mut out = vec![E::default(); src.len()];
    in_pieces(src, &mut out, PIECE, |src, dst| {
        dst.copy_from_slice(src);
        f(dst);
    });
    flex_view::tensor(out, tensor.layout().shape().clone())
}

/// `f` over pieces of `values`, on rayon's threads when there are several.
fn pieces_in_place<T: Send>(values: &mut [T], f: impl Fn(&mut [T]) + Sync) {
    if values.len() <= PIECE {
        f(values);
    } else {
        values.par_chunks_mut(PIECE).for_each(&f);
    }
}

/// `op(a, b)` with `b` updated in place, over two tensors of one shape and type; operands of
/// different shapes or types, or `f64` ones, come back as the `Err`.
pub(super) fn binary(
    a: FlexTensor,
    b: FlexTensor,
    op: impl Fn(&[f32], &mut [f32]) + Sync,
) -> FastPath<(FlexTensor, FlexTensor)> {
    if a.layout().shape() != b.layout().shape() || a.dtype() != b.dtype() {
        return Err((a, b));
    }
    match a.dtype() {
        DType::F32 => Ok(binary_f32(&a, &b, &op)),
        DType::BF16 => Ok(binary_half::<bf16>(&a, &b, &op)),
        DType::F16 => Ok(binary_half::<f16>(&a, &b, &op)),
        _ => Err((a, b)),
    }
}

/// Contiguous copies of `a` and `b` where they are not (their values in order).
fn contiguous_pair(a: &FlexTensor, b: &FlexTensor) -> (FlexTensor, FlexTensor) {
    (flex_view::contiguous(a), flex_view::contiguous(b))
}

fn binary_f32(
    a: &FlexTensor,
    b: &FlexTensor,
    op: &(impl Fn(&[f32], &mut [f32]) + Sync),
) -> FlexTensor {
    let (a, b) = contiguous_pair(a, b);
    let x = flex_view::values::<f32>(&a).expect("contiguous");
    let y = flex_view::values::<f32>(&b).expect("contiguous");
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(PIECE)
        .zip(x.par_chunks(PIECE).zip(y.par_chunks(PIECE)))
        .for_each(|(dst, (x, y))| {
            dst.copy_from_slice(y);
            op(x, dst);
        });
    flex_view::tensor(out, a.layout().shape().clone())
}

/// [`binary_f32`] of half values: `b` copied into the output, which is taken through `f32` a
/// chunk at a time while the matching chunk of `a` is widened beside it.
fn binary_half<H: Half>(
    a: &FlexTensor,
    b: &FlexTensor,
    op: &(impl Fn(&[f32], &mut [f32]) + Sync),
) -> FlexTensor {
    let (a, b) = contiguous_pair(a, b);
    let x = flex_view::values::<H>(&a).expect("contiguous");
    let y = flex_view::values::<H>(&b).expect("contiguous");
    let mut out = vec![H::default(); x.len()];
    out.par_chunks_mut(PIECE)
        .zip(x.par_chunks(PIECE).zip(y.par_chunks(PIECE)))
        .for_each(|(dst, (x, y))| {
            dst.copy_from_slice(y);
            let (mut wide, mut at) = (Vec::new(), 0);
            through_f32(dst, |b| {
                wide.resize(b.len(), 0.0);
                H::widen(&x[at..at + b.len()], &mut wide);
                op(&wide, b);
                at += b.len();
            });
        });
    flex_view::tensor(out, a.layout().shape().clone())
}

/// The exact GELU (Burn's `gelu`), on [`math::gelu_in_place`] (`erf` within 1 ulp).
pub(super) fn gelu(tensor: FlexTensor) -> FastPath<FlexTensor> {
    unary(tensor, math::gelu_in_place)
}

/// `eˣ` on [`math::exp_in_place`] (within 1 ulp).
pub(super) fn exp(tensor: FlexTensor) -> FastPath<FlexTensor> {
    unary(tensor, math::exp_in_place)
}

/// `erf` on [`math::erf_in_place`] (within 1 ulp).
pub(super) fn erf(tensor: FlexTensor) -> FastPath<FlexTensor> {
    unary(tensor, math::erf_in_place)
}

/// `tanh` on [`math::tanh_in_place`] (within 1.1 ulp).
pub(super) fn tanh(tensor: FlexTensor) -> FastPath<FlexTensor> {
    unary(tensor, math::tanh_in_place)
}

/// GELU's backward, `grad · gelu'(x)`.
pub(super) fn gelu_backward(x: FlexTensor, grad: FlexTensor) -> FastPath<(FlexTensor, FlexTensor)> {
    binary(x, grad, |x, grad| Activation::Gelu.backward_to(x, grad))
}
