//! Operations over the last dimension of a tensor, row by row, on burn-cpu-kernels'
//! vectorised row kernels: `softmax`, `log_softmax` and `layer_norm`, each one pass per row
//! where Flex's `layer_norm` (and the trait's default) runs several whole-tensor passes.
//! `bf16` and `f16` rows are widened once, computed in `f32` and rounded once.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType};
use half::{bf16, f16};

use burn_cpu_kernels::{layer_norm, softmax};

use super::convert::{self, Half};

/// `f(src, dst, n)` over the rows of `tensor`'s last dimension (`n` values each), or `None`
/// for `f64` (Flex's operation runs).
fn by_rows(
    tensor: &FlexTensor,
    f: impl Fn(&[f32], &mut [f32], usize),
) -> Option<FlexTensor> {
    let dtype = tensor.dtype();
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        return None;
    }
    let shape = tensor.layout().shape().clone();
    let n = *shape.last()?;
    let layout = Layout::contiguous(shape);
    let len = layout.num_elements();
    if len == 0 {
        return None;
    }
    let contiguous = tensor.to_contiguous();
    let start = contiguous.layout().start_offset();
    let mut out = vec![0.0f32; len];
    match dtype {
        DType::F32 => f(&contiguous.storage::<f32>()[start..start + len], &mut out, n),
        DType::BF16 => f(&widened::<bf16>(&contiguous, start, len), &mut out, n),
        _ => f(&widened::<f16>(&contiguous, start, len), &mut out, n),
    }
    let out = FlexTensor::new(Bytes::from_elems(out), layout, DType::F32);
    Some(match dtype {
        DType::BF16 => convert::narrow::<bf16>(&out),
        DType::F16 => convert::narrow::<f16>(&out),
        _ => out,
    })
}

fn widened<H: Half>(tensor: &FlexTensor, start: usize, len: usize) -> Vec<f32> {
    let mut values = vec![0.0f32; len];
    H::widen(&tensor.storage::<H>()[start..start + len], &mut values);
    values
}

/// A 1-D parameter (`gamma`, `beta`) as `f32` values.
fn parameter(tensor: &FlexTensor) -> Vec<f32> {
    let t = super::to_f32(tensor.clone()).to_contiguous();
    let start = t.layout().start_offset();
    t.storage::<f32>()[start..start + t.layout().num_elements()].to_vec()
}

/// Softmax over `dim`, vectorised where `dim` is the last; `None` where Flex's runs.
pub(super) fn softmax(tensor: &FlexTensor, dim: usize) -> Option<FlexTensor> {
    if dim + 1 != tensor.layout().num_dims() {
        return None;
    }
    by_rows(tensor, softmax::softmax_rows)
}

/// Log-softmax over `dim`, as [`softmax`].
pub(super) fn log_softmax(tensor: &FlexTensor, dim: usize) -> Option<FlexTensor> {
    if dim + 1 != tensor.layout().num_dims() {
        return None;
    }
    by_rows(tensor, softmax::log_softmax_rows)
}

/// Layer normalisation over the last dimension, one pass per row for the statistics and one
/// for the output (biased variance, as Burn's and PyTorch's).
pub(super) fn layer_norm(
    tensor: &FlexTensor,
    gamma: &FlexTensor,
    beta: Option<&FlexTensor>,
    epsilon: f64,
) -> Option<FlexTensor> {
    let n = *tensor.layout().shape().last()?;
    if gamma.layout().num_elements() != n || beta.is_some_and(|b| b.layout().num_elements() != n)
    {
        return None;
    }
    let gamma = parameter(gamma);
    let beta = beta.map(parameter);
    by_rows(tensor, |x, y, n| {
        layer_norm::layer_norm_rows(x, &gamma, beta.as_deref(), epsilon as f32, y, n, None);
    })
}
