//! Cross-entropy from logits as one training operation: [`fused_cross_entropy`], which keeps
//! one log-sum-exp per row for its backward rather than the `[rows, classes]`
//! probabilities.

use burn::tensor::{Int, Tensor};

use crate::FusedBackend;
pub use crate::backend::CrossEntropyForward;

/// The mean cross-entropy of `logits` against `targets`, rows whose target is
/// `ignore_index` left out of the mean (Burn's `CrossEntropyLoss` without label smoothing or
/// weights); differentiable in `logits` as one node.
///
/// # Shapes
/// - `logits`: `[rows, classes]`, `targets`: `[rows]`
/// - output: `[1]`
///
/// # Panics
/// If `targets` does not have one value per row.
pub fn fused_cross_entropy<B: FusedBackend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    ignore_index: Option<usize>,
) -> Tensor<B, 1> {
    let [rows, _] = logits.dims();
    assert_eq!(
        targets.dims(),
        [rows],
        "fused_cross_entropy: {rows} rows of logits but {:?} targets",
        targets.dims()
    );
    B::fused_cross_entropy_forward(logits, targets, ignore_index).loss
}
