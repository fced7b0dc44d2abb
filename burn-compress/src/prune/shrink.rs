//! Structured pruning made real: smaller tensors, not zeros.

use crate::CompressError;

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
    /// [`CompressError::InvalidShape`] for indices out of range or not strictly increasing, or
    /// none; [`CompressError::Unsupported`] for a layer that cannot drop outputs (a grouped
    /// convolution).
    fn keep_outputs(&self, keep: &[usize]) -> Result<Self, CompressError>;

    /// The layer reading only the inputs `keep`.
    ///
    /// # Errors
    /// As [`keep_outputs`](Self::keep_outputs).
    fn keep_inputs(&self, keep: &[usize]) -> Result<Self, CompressError>;
}

/// Shrinks two consecutive layers, `first: inputs → n` and `second: n → outputs`, to
/// `inputs → keep.len() → outputs`: `first` keeps only the outputs `keep`, `second` reads only
/// those inputs. With `keep` from a structured mask
/// ([`MaskedLinear::kept_outputs`](super::MaskedLinear::kept_outputs)) and an activation with
/// `f(0) = 0` between them, the pair computes what the masked pair did; the book's "Pruning"
/// chapter says why, and what other activations need.
///
/// # Errors
/// [`CompressError::InvalidShape`] if `first`'s outputs are not `second`'s inputs, or `keep` is
/// empty, out of range or not strictly increasing; [`CompressError::Unsupported`] from a layer
/// that cannot shrink.
pub fn shrink_pair<A: Shrink, C: Shrink>(
    first: &A,
    second: &C,
    keep: &[usize],
) -> Result<(A, C), CompressError> {
    if first.outputs() != second.inputs() {
        return Err(CompressError::InvalidShape {
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
) -> Result<(), CompressError> {
    let increasing = keep.windows(2).all(|w| w[0] < w[1]);
    let in_range = keep.last().is_some_and(|&last| last < n);
    if keep.is_empty() || !increasing || !in_range {
        return Err(CompressError::InvalidShape {
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
