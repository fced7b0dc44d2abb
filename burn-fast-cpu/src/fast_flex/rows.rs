//! Operations over the last dimension of a tensor, row by row, on burn-cpu-kernels'
//! vectorised row kernels: `softmax`, `log_softmax` and `layer_norm`, each one pass per row
//! where Flex's `layer_norm` (and the trait's default) runs several whole-tensor passes.
//! `bf16` and `f16` rows are widened once, computed in `f32` and rounded once.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType};
use half::{bf16, f16};

use burn_cpu_kernels::Isa;
use burn_cpu_kernels::{layer_norm, softmax};
use rayon::prelude::*;

use super::convert::Half;

/// Rows per piece: a piece (and a half piece's `f32` scratch) stays in cache.
const ROWS: usize = 64;

/// `f(rows, n)` in place over the rows of `tensor`'s last dimension (`n` values each): in
/// the tensor's own buffer when no other tensor shares it (`f32`), a piece of rows at a time
/// through an `f32` scratch for `bf16` and `f16`; `Err(tensor)` for `f64` or an empty tensor
/// (Flex's operation runs).
fn by_rows(
    tensor: FlexTensor,
    f: impl Fn(&mut [f32], usize) + Sync,
) -> Result<FlexTensor, FlexTensor> {
    let dtype = tensor.dtype();
    let n = tensor.layout().shape().last().copied().unwrap_or(0);
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
        || n == 0
        || tensor.layout().num_elements() == 0
    {
        return Err(tensor);
    }
    let mut tensor = if tensor.is_unique() && tensor.layout().is_contiguous() {
        tensor
    } else {
        let copy = super::copy::contiguous(&tensor);
        drop(tensor);
        if copy.is_unique() && copy.layout().is_contiguous() {
            copy
        } else {
            // Still shared (`contiguous` hands back the buffer of a tensor that is contiguous
            // already, and someone else holds it): a copy of our own to overwrite.
            let shape = copy.layout().shape().clone();
            let (start, len) = (copy.layout().start_offset(), copy.layout().num_elements());
            let bytes = match dtype {
                DType::F32 => Bytes::from_elems(copy.storage::<f32>()[start..start + len].to_vec()),
                DType::BF16 => {
                    Bytes::from_elems(copy.storage::<bf16>()[start..start + len].to_vec())
                }
                _ => Bytes::from_elems(copy.storage::<f16>()[start..start + len].to_vec()),
            };
            FlexTensor::new(bytes, Layout::contiguous(shape), dtype)
        }
    };
    let start = tensor.layout().start_offset();
    let len = tensor.layout().num_elements();
    match dtype {
        DType::F32 => {
            let values = tensor.try_storage_mut::<f32>().expect("held alone");
            values[start..start + len]
                .par_chunks_mut(n * ROWS)
                .for_each(|piece| f(piece, n));
        }
        DType::BF16 => {
            let values = tensor.try_storage_mut::<bf16>().expect("held alone");
            half_rows(&mut values[start..start + len], n, &f);
        }
        _ => {
            let values = tensor.try_storage_mut::<f16>().expect("held alone");
            half_rows(&mut values[start..start + len], n, &f);
        }
    }
    Ok(tensor)
}

/// `f` over pieces of [`ROWS`] rows of half values, each widened into a scratch, computed and
/// rounded back, on rayon's threads.
fn half_rows<H: Half>(values: &mut [H], n: usize, f: &(impl Fn(&mut [f32], usize) + Sync)) {
    values.par_chunks_mut(n * ROWS).for_each(|piece| {
        let mut scratch = vec![0.0f32; piece.len()];
        H::widen(piece, &mut scratch);
        f(&mut scratch, n);
        H::narrow(&scratch, piece);
    });
}

/// Softmax over `dim`, vectorised where `dim` is the last; `Err(tensor)` where Flex's runs.
pub(super) fn softmax(tensor: FlexTensor, dim: usize) -> Result<FlexTensor, FlexTensor> {
    if dim + 1 != tensor.layout().num_dims() {
        return Err(tensor);
    }
    by_rows(tensor, softmax::softmax_rows_in_place)
}

/// Log-softmax over `dim`, as [`softmax`].
pub(super) fn log_softmax(tensor: FlexTensor, dim: usize) -> Result<FlexTensor, FlexTensor> {
    if dim + 1 != tensor.layout().num_dims() {
        return Err(tensor);
    }
    by_rows(tensor, |rows, n| {
        softmax::forward_rows_on(Isa::detected(), true, None, rows, n, None);
    })
}

/// Layer normalisation over the last dimension: per row, one pass for the statistics and one
/// for the output (biased variance, as Burn's and PyTorch's); `Err(tensor)` where Flex's
/// runs (`f64`, parameters of another length).
pub(super) fn layer_norm(
    tensor: FlexTensor,
    gamma: &FlexTensor,
    beta: Option<&FlexTensor>,
    epsilon: f64,
) -> Result<FlexTensor, FlexTensor> {
    let n = tensor.layout().shape().last().copied().unwrap_or(0);
    if gamma.layout().num_elements() != n || beta.is_some_and(|b| b.layout().num_elements() != n) {
        return Err(tensor);
    }
    let gamma = super::f32_values(gamma);
    let beta = beta.map(super::f32_values);
    by_rows(tensor, |rows, n| {
        let x = rows.to_vec();
        layer_norm::layer_norm_rows(&x, &gamma, beta.as_deref(), epsilon as f32, rows, n, None);
    })
}
