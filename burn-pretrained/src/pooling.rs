//! Sentence embeddings from token states, as sentence-transformers computes them: the mean
//! over real tokens, then unit length.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// The mean of each sequence's states over its real tokens.
///
/// # Shapes
/// - hidden: `[batch, seq, hidden]`
/// - mask_pad: `[batch, seq]`, `true` at padding (`None`: every token is real)
/// - output: `[batch, hidden]`
pub fn mean_pool<B: Backend>(
    hidden: Tensor<B, 3>,
    mask_pad: Option<Tensor<B, 2, Bool>>,
) -> Tensor<B, 2> {
    let [batch, seq, width] = hidden.dims();
    match mask_pad {
        None => hidden.mean_dim(1).reshape([batch, width]),
        Some(pad) => {
            let real = pad.bool_not().float().reshape([batch, seq, 1]);
            // sentence-transformers clamps the count at 1e-9, so an all-padding row gives 0.
            let count = real.clone().sum_dim(1).clamp_min(1e-9);
            (hidden * real)
                .sum_dim(1)
                .div(count)
                .reshape([batch, width])
        }
    }
}

/// Each row divided by its Euclidean norm (at least 10⁻¹², as PyTorch's `normalize`).
///
/// # Shapes
/// - x, output: `[batch, hidden]`
pub fn normalize<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    x.div(norm)
}
