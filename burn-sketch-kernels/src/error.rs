//! What the launchers refuse, as a typed error.

use burn_backend::DType;

/// Why [`forward`](crate::forward) or [`backward`](crate::backward) refused their operands.
///
/// Launching with operands that do not fit together would read or write out of bounds on
/// the device, so every launcher checks first, as burn-cubecl's matmul and reduce do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// An operand's shape does not fit the others'.
    #[error("sketched linear: `{operand}` has shape {found:?}, expected {expected}")]
    Shape {
        /// The operand's name (`x`, `s1s`, `s2s`, `u1s`, `u2s`, `bias`, `grad_output`).
        operand: &'static str,
        /// Its shape.
        found: Vec<usize>,
        /// The shape the other operands imply.
        expected: String,
    },
    /// An operand's element type differs from `x`'s, or is not a float type.
    #[error(
        "sketched linear: `{operand}` is {found:?}, expected {expected:?} (the element type of `x`, a float type)"
    )]
    DType {
        /// The operand's name.
        operand: &'static str,
        /// Its element type.
        found: DType,
        /// `x`'s element type.
        expected: DType,
    },
    /// The fused forward holds `P` in shared memory, which bounds its rank.
    #[error("fused forward: rank 2Tk = {rank} exceeds the fused kernel's {max}")]
    FusedRankTooWide {
        /// `2Tk`.
        rank: usize,
        /// [`MAX_FUSED_RANK`](crate::fused::MAX_FUSED_RANK).
        max: usize,
    },
}
