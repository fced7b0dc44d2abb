//! The crate's error type.

use burn_randnla::LinalgError;
use burn_sketch::SketchError;

/// What a layer construction, conversion, search or pruning cannot do with its input: returned
/// instead of a panic, so that an application can report the problem and carry on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    /// A configuration value is out of range (a zero size, heads that do not divide the width).
    #[error("invalid `{name}` = {value}: {reason}")]
    InvalidConfig {
        /// The configuration field at fault.
        name: &'static str,
        /// Its value, as given.
        value: usize,
        /// Why the value cannot be used.
        reason: &'static str,
    },

    /// A value that must be a fraction in `[0, 1]` is not (a pruning amount).
    #[error("invalid `{name}` = {value}: must be a fraction in [0, 1]")]
    InvalidFraction {
        /// The parameter at fault.
        name: &'static str,
        /// Its value, as given.
        value: f64,
    },

    /// A tensor given to an operation has a shape it cannot take (a mask, a layer pair to
    /// shrink).
    #[error("{operation}: shape {shape:?} {reason}")]
    InvalidShape {
        /// The operation that was called.
        operation: &'static str,
        /// The shape given.
        shape: Vec<usize>,
        /// What the operation needs.
        reason: String,
    },

    /// A tensor does not have the shape of the one it goes with (a mask and its weight).
    #[error("tensor `{key}` has shape {found:?}, expected {expected}")]
    ShapeMismatch {
        /// The tensor at fault.
        key: String,
        /// Its shape.
        found: Vec<usize>,
        /// A description of the shape that was expected.
        expected: String,
    },

    /// A conversion or search was asked for something the library cannot do (converting a
    /// layer to a kind it has no construction for).
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked.
        what: String,
    },

    /// A path or type pattern of a [`Selection`](crate::Selection) picks no layer of the model
    /// (a typo would otherwise leave the model unchanged).
    #[error("`{pattern}` picks no layer; the model's layers are: {}", layers.join(", "))]
    NoMatch {
        /// The pattern.
        pattern: String,
        /// The paths of the model's layers, for the message.
        layers: Vec<String>,
    },

    /// A search found no configuration that meets its threshold.
    #[error("no configuration meets the threshold: {reason}")]
    NothingPasses {
        /// What the trials reached, for the message.
        reason: String,
    },

    /// A sketched layer could not be built or a checkpoint could not be read.
    #[error(transparent)]
    Sketch(#[from] SketchError),

    /// A factorisation of a layer's weights failed (a low-rank conversion).
    #[error(transparent)]
    Linalg(#[from] LinalgError),
}

impl CompressError {
    /// [`CompressError::InvalidConfig`] naming the first of `sizes` that is zero.
    pub(crate) fn first_zero(
        sizes: impl IntoIterator<Item = (&'static str, usize)>,
    ) -> Result<(), CompressError> {
        match sizes.into_iter().find(|&(_, value)| value == 0) {
            Some((name, value)) => Err(CompressError::InvalidConfig {
                name,
                value,
                reason: "must be at least 1",
            }),
            None => Ok(()),
        }
    }
}
