//! Structured pruning made real: smaller tensors, not zeros.

use crate::SketchError;

/// A layer whose output rows (channels) and input columns can be removed.
///
/// Removing output `j` of one layer removes input `j` of the next, so the two are shrunk
/// together by [`shrink_pair`].
pub trait Shrink: Sized {
    /// Width of the input: `d_input` or input channels.
    fn inputs(&self) -> usize;

    /// Width of the output: `d_output` or output channels.
    fn outputs(&self) -> usize;

    /// The layer with only the outputs `keep` (and their bias), in that order.
    ///
    /// # Errors
    /// [`SketchError::InvalidShape`] for indices out of range or not strictly increasing, or
    /// none; [`SketchError::Unsupported`] for a layer that cannot drop outputs (a grouped
    /// convolution).
    fn keep_outputs(&self, keep: &[usize]) -> Result<Self, SketchError>;

    /// The layer reading only the inputs `keep`.
    ///
    /// # Errors
    /// As [`keep_outputs`](Self::keep_outputs).
    fn keep_inputs(&self, keep: &[usize]) -> Result<Self, SketchError>;
}

/// Shrinks two consecutive layers: `first` keeps only the outputs `keep`, and `second` reads
/// only those inputs.
///
/// With `keep` from a structured mask ([`MaskedLinear::kept_outputs`](super::MaskedLinear::kept_outputs)),
/// the pair computes what the masked pair computed with an elementwise activation `f` between
/// them that has `f(0) = 0` (ReLU, GELU, tanh): a removed output was `0` (its row and bias were
/// masked), and so contributed nothing to `second`. An activation with `f(0) ≠ 0` (sigmoid), or
/// a normalization between the layers, changes that: the pair then differs from the masked one
/// and needs the fine-tuning that follows pruning anyway.
///
/// # Shapes
/// - `first`: `inputs → n`, `second`: `n → outputs`
/// - result: `inputs → keep.len()`, `keep.len() → outputs`
///
/// # Errors
/// [`SketchError::InvalidShape`] if `first`'s outputs are not `second`'s inputs, or `keep` is
/// empty, out of range or not strictly increasing; [`SketchError::Unsupported`] from a layer
/// that cannot shrink.
pub fn shrink_pair<A: Shrink, C: Shrink>(
    first: &A,
    second: &C,
    keep: &[usize],
) -> Result<(A, C), SketchError> {
    if first.outputs() != second.inputs() {
        return Err(SketchError::InvalidShape {
            operation: "shrink_pair",
            shape: vec![first.outputs(), second.inputs()],
            reason: "the first layer's outputs must be the second layer's inputs".into(),
        });
    }
    Ok((first.keep_outputs(keep)?, second.keep_inputs(keep)?))
}

/// Checks that `keep` picks a non-empty, strictly increasing subset of `0..n`.
pub(crate) fn check_keep(
    operation: &'static str,
    keep: &[usize],
    n: usize,
) -> Result<(), SketchError> {
    let increasing = keep.windows(2).all(|w| w[0] < w[1]);
    let in_range = keep.last().is_some_and(|&last| last < n);
    if keep.is_empty() || !increasing || !in_range {
        return Err(SketchError::InvalidShape {
            operation,
            shape: vec![keep.len(), n],
            reason: format!(
                "(indices kept, width) : needs at least one index, strictly increasing, each \
                 below {n}"
            ),
        });
    }
    Ok(())
}
