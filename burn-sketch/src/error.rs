//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong when building or loading a sketched layer.
///
/// Library functions return it for bad input (invalid sizes, malformed checkpoints) instead of
/// panicking, so an application can report the problem and carry on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SketchError {
    /// A configuration value is out of range (a zero size, an odd sketch size, ...).
    #[error("invalid `{name}` = {value}: {reason}")]
    InvalidConfig {
        /// The configuration field at fault.
        name: &'static str,
        /// Its value, as given.
        value: usize,
        /// Why the value cannot be used.
        reason: &'static str,
    },

    /// A checkpoint lacks a tensor the layer needs.
    #[error("checkpoint has no tensor `{key}`")]
    MissingKey {
        /// The full state-dict key that was looked up.
        key: String,
    },

    /// A checkpoint tensor has a shape that does not fit the layer (or the other tensors).
    #[error("tensor `{key}` has shape {found:?}, expected {expected}")]
    ShapeMismatch {
        /// The full state-dict key.
        key: String,
        /// The shape found in the file.
        found: Vec<usize>,
        /// A description of the shape that was expected.
        expected: String,
    },

    /// A checkpoint tensor is stored in an element type we cannot convert to floats.
    #[error("tensor `{key}` has unsupported dtype {dtype}")]
    UnsupportedDtype {
        /// The full state-dict key.
        key: String,
        /// The dtype as named by the file format.
        dtype: String,
    },

    /// The file is not a valid checkpoint (safetensors or PyTorch) file.
    #[error("cannot parse checkpoint file {path}: {message}")]
    Format {
        /// The file that was read.
        path: PathBuf,
        /// The parser's explanation.
        message: String,
    },

    /// A checkpoint tensor's bytes are not all in the file: its storage is shorter than its
    /// offset, shape and strides need, or the file holds less of the storage than it declares,
    /// or lacks it.
    #[error("tensor `{key}` is corrupt: {reason}")]
    Corrupt {
        /// The full state-dict key.
        key: String,
        /// What does not fit.
        reason: String,
    },

    /// A checkpoint value does not fit in `f32`, the type the layer is loaded in (a finite
    /// `f64` beyond ±3.4·10³⁸).
    #[error("tensor `{key}` holds {value:e}, beyond the range of f32")]
    OutOfRange {
        /// The full state-dict key.
        key: String,
        /// The first value that does not fit.
        value: f64,
    },

    /// A checkpoint tensor's data could not be decoded.
    #[error("cannot decode tensor `{key}`: {message}")]
    Decode {
        /// The full state-dict key.
        key: String,
        /// The decoder's explanation.
        message: String,
    },

    /// Something the library cannot do (a checkpoint layout or a layer construction it has
    /// no code for).
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked.
        what: String,
    },

    /// A factorisation of a layer's weights failed (converting a dense layer).
    #[error(transparent)]
    Linalg(#[from] burn_randnla::LinalgError),

    /// Reading or writing a file failed.
    #[error("i/o error on {path}")]
    Io {
        /// The file that was accessed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl SketchError {
    /// [`SketchError::InvalidConfig`] naming the first of `sizes` that is zero.
    pub(crate) fn first_zero(
        sizes: impl IntoIterator<Item = (&'static str, usize)>,
    ) -> Result<(), SketchError> {
        match sizes.into_iter().find(|&(_, value)| value == 0) {
            Some((name, value)) => Err(SketchError::InvalidConfig {
                name,
                value,
                reason: "must be at least 1",
            }),
            None => Ok(()),
        }
    }
}
