//! Softmax and log-softmax as one training operation each: [`fused_softmax`] and
//! [`fused_log_softmax`], whose backward needs only the output.

use burn::tensor::Tensor;

use crate::FusedBackend;

/// Which of the two row operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftmaxKind {
    /// `exp(x − max)/Σ exp(x − max)`.
    Softmax,
    /// `x − max − ln Σ exp(x − max)`.
    LogSoftmax,
}

/// `kind` over dimension `dim` of `x`, as rows of the last dimension.
fn over_dim<B: FusedBackend, const D: usize>(
    x: Tensor<B, D>,
    dim: usize,
    kind: SoftmaxKind,
) -> Tensor<B, D> {
    assert!(dim < D, "softmax over dimension {dim} of a rank-{D} tensor");
    let x = x.swap_dims(dim, D - 1);
    let shape = x.dims();
    let n = shape[D - 1];
    let rows = shape[..D - 1].iter().product();
    B::fused_softmax_forward(x.reshape([rows, n]), kind)
        .reshape(shape)
        .swap_dims(dim, D - 1)
}

/// Softmax over `dim`, differentiable as one node that keeps its output.
///
/// # Panics
/// If `dim` is not a dimension of `x`.
pub fn fused_softmax<B: FusedBackend, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    over_dim(x, dim, SoftmaxKind::Softmax)
}

/// Log-softmax over `dim`, as [`fused_softmax`].
///
/// # Panics
/// If `dim` is not a dimension of `x`.
pub fn fused_log_softmax<B: FusedBackend, const D: usize>(
    x: Tensor<B, D>,
    dim: usize,
) -> Tensor<B, D> {
    over_dim(x, dim, SoftmaxKind::LogSoftmax)
}
