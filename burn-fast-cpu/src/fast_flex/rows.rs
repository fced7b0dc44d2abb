//! Operations over the last dimension of a tensor, row by row, on burn-cpu-kernels'
//! vectorised row kernels: `softmax`, `log_softmax` and `layer_norm`, each one pass per row
//! where Flex's `layer_norm` (and the trait's default) runs several whole-tensor passes.
//! `bf16` and `f16` rows are widened once, computed in `f32` and rounded once
//! ([`through_f32_rows`]).

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use burn_cpu_kernels::convert::through_f32_rows;
use half::{bf16, f16};

use burn_cpu_kernels::Isa;
use burn_cpu_kernels::{layer_norm, softmax};
use rayon::prelude::*;

use super::convert::Half;
use super::{FastPath, f32_values};
use crate::flex_view::{self, FlexFloat};

/// Rows per piece: the unit rayon's threads share.
const ROWS: usize = 64;

/// `f(rows, n)` in place over the rows of `tensor`'s last dimension (`n` values each): in
/// the tensor's own buffer when no other tensor shares it, `bf16` and `f16` rows through an
/// `f32` scratch; `f64` and empty tensors come back as the `Err`.
fn by_rows(tensor: FlexTensor, f: impl Fn(&mut [f32], usize) + Sync) -> FastPath<FlexTensor> {
    let n = tensor.layout().shape().last().copied().unwrap_or(0);
    if n == 0 || tensor.layout().num_elements() == 0 {
        return Err(tensor);
    }
    match tensor.dtype() {
        DType::F32 => Ok(rows_in::<f32>(tensor, |values| {
            values
                .par_chunks_mut(n * ROWS)
                .for_each(|piece| f(piece, n));
        })),
        DType::BF16 => Ok(rows_in::<bf16>(tensor, |values| half_rows(values, n, &f))),
        DType::F16 => Ok(rows_in::<f16>(tensor, |values| half_rows(values, n, &f))),
        _ => Err(tensor),
    }
}

/// `apply` on the values of `tensor`, or of a contiguous copy of our own where another
/// tensor shares its buffer or it is strided.
fn rows_in<E: FlexFloat>(tensor: FlexTensor, apply: impl FnOnce(&mut [E])) -> FlexTensor {
    let mut tensor = if tensor.layout().is_contiguous() {
        tensor
    } else {
        flex_view::contiguous(&tensor)
    };
    // Written in place where no other tensor (nor a kept weight form's `Weak`) holds the
    // buffer; `contiguous` hands back the buffer of a tensor that is contiguous already.
    if let Some(values) = flex_view::values_mut::<E>(&mut tensor) {
        apply(values);
        return tensor;
    }
    let mut values = flex_view::values::<E>(&tensor)
        .expect("contiguous")
        .to_vec();
    apply(&mut values);
    flex_view::tensor(values, tensor.layout().shape().clone())
}

/// `f` over pieces of [`ROWS`] rows of half values, on rayon's threads, each taken through
/// `f32` in chunks of whole rows.
fn half_rows<H: Half>(values: &mut [H], n: usize, f: &(impl Fn(&mut [f32], usize) + Sync)) {
    values.par_chunks_mut(n * ROWS).for_each(|piece| {
        through_f32_rows(piece, n, |rows| f(rows, n));
    });
}

/// Softmax over `dim`, vectorised where `dim` is the last (other dimensions come back as
/// the `Err`).
pub(super) fn softmax(tensor: FlexTensor, dim: usize) -> FastPath<FlexTensor> {
    if dim + 1 != tensor.layout().num_dims() {
        return Err(tensor);
    }
    by_rows(tensor, softmax::softmax_rows_in_place)
}

/// Log-softmax over `dim`, as [`softmax`].
pub(super) fn log_softmax(tensor: FlexTensor, dim: usize) -> FastPath<FlexTensor> {
    if dim + 1 != tensor.layout().num_dims() {
        return Err(tensor);
    }
    by_rows(tensor, |rows, n| {
        softmax::forward_rows_on(Isa::detected(), true, None, rows, n, None);
    })
}

/// Layer normalisation over the last dimension: per row, one pass for the statistics and one
/// for the output (biased variance, as Burn's and PyTorch's); `f64` tensors or parameters,
/// and parameters of another length, come back as the `Err`.
pub(super) fn layer_norm(
    tensor: FlexTensor,
    gamma: &FlexTensor,
    beta: Option<&FlexTensor>,
    epsilon: f64,
) -> FastPath<FlexTensor> {
    let n = tensor.layout().shape().last().copied().unwrap_or(0);
    let ours = |t: &FlexTensor| matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16);
    let parameters = [Some(gamma), beta].into_iter().flatten();
    if !ours(&tensor)
        || parameters
            .clone()
            .any(|p| !ours(p) || p.layout().num_elements() != n)
    {
        return Err(tensor);
    }
    let gamma = f32_values(gamma);
    let beta = beta.map(f32_values);
    by_rows(tensor, |rows, n| {
        let x = rows.to_vec();
        layer_norm::layer_norm_rows(&x, &gamma, beta.as_deref(), epsilon as f32, rows, n, None);
    })
}
