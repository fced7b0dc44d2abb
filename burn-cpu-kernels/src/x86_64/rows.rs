//! The row kernels compiled for AVX-512 with fused multiply-adds: [`crate::softmax`]'s,
//! [`crate::layer_norm`]'s and [`crate::cross_entropy`]'s forward and backward. Each wrapper is the module's portable
//! generic block body with `FMA = true`, compiled here with the target features so that its
//! per-row loops (sixteen accumulator lanes) run one register wide.

use crate::layer_norm::BackwardBlock;
use crate::softmax::{Backward, Forward, RowMask};

/// `crate::softmax::forward_block` compiled for AVX-512 with fused multiply-adds.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and DQ and FMA: call only where
/// [`Isa::avx512`](crate::Isa::avx512) holds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn softmax_forward_avx512(
    op: Forward,
    first: usize,
    src: Option<&[f32]>,
    block: &mut [f32],
    n: usize,
    mask: Option<RowMask<'_>>,
) {
    crate::softmax::forward_block::<true>(op, first, src, block, n, mask);
}

/// `crate::softmax::backward_block` compiled for AVX-512 with fused multiply-adds.
///
/// # Safety
/// As [`softmax_forward_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn softmax_backward_avx512(
    op: Backward,
    y: &[f32],
    dy: Option<&[f32]>,
    block: &mut [f32],
    n: usize,
) {
    crate::softmax::backward_block::<true>(op, y, dy, block, n);
}

/// `crate::layer_norm::forward_block` compiled for AVX-512 with fused multiply-adds.
///
/// # Safety
/// As [`softmax_forward_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm_forward_avx512(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
    n: usize,
    mean: Option<&mut [f32]>,
    rstd: Option<&mut [f32]>,
) {
    crate::layer_norm::forward_block::<true>(x, gamma, beta, eps, y, n, mean, rstd);
}

/// `crate::layer_norm::backward_block` compiled for AVX-512 with fused multiply-adds.
///
/// # Safety
/// As [`softmax_forward_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn layer_norm_backward_avx512(
    args: &BackwardBlock<'_>,
    dx: &mut [f32],
    dgamma: Option<&mut [f32]>,
    dbeta: Option<&mut [f32]>,
) {
    crate::layer_norm::backward_block::<true>(args, dx, dgamma, dbeta);
}

/// `crate::cross_entropy::forward_block` compiled for AVX-512 with fused multiply-adds.
///
/// # Safety
/// As [`softmax_forward_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn cross_entropy_forward_avx512(
    logits: &[f32],
    n: usize,
    targets: &[i64],
    ignore: Option<i64>,
    lse: &mut [f32],
    losses: &mut [f32],
) {
    crate::cross_entropy::forward_block::<true>(logits, n, targets, ignore, lse, losses);
}

/// `crate::cross_entropy::backward_block` compiled for AVX-512 with fused multiply-adds.
///
/// # Safety
/// As [`softmax_forward_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) fn cross_entropy_backward_avx512(
    src: Option<&[f32]>,
    grad: &mut [f32],
    n: usize,
    lse: &[f32],
    targets: &[i64],
    ignore: Option<i64>,
    scale: f32,
) {
    crate::cross_entropy::backward_block::<true>(src, grad, n, lse, targets, ignore, scale);
}
