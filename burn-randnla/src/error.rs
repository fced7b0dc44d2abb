//! The crate's error type.

/// What a sketching operator or factorisation cannot take: returned instead of a panic, so that
/// an application can report the problem and carry on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinalgError {
    /// A configuration value is out of range (a zero size, a sketch larger than its input).
    #[error("invalid `{name}` = {value}: {reason}")]
    InvalidConfig {
        /// The configuration field at fault.
        name: &'static str,
        /// Its value, as given.
        value: usize,
        /// Why the value cannot be used.
        reason: &'static str,
    },

    /// A matrix has a shape the operation cannot take (empty, wide where tall is needed, or not
    /// matching the operator).
    #[error("{operation}: shape {shape:?} {reason}")]
    InvalidShape {
        /// The operation that was called.
        operation: &'static str,
        /// The shape given.
        shape: Vec<usize>,
        /// What the operation needs.
        reason: String,
    },

    /// A matrix holds a NaN or an infinity, which no factorisation of it can survive.
    #[error("{operation}: the input holds NaN or infinite values")]
    NonFinite {
        /// The operation that was called.
        operation: &'static str,
    },

    /// A factorisation that needs full column rank met a matrix without it.
    #[error(
        "{operation}: the {columns} columns are numerically rank-deficient (rank {rank} found); \
         `qr_pivoted` and `Cqrrpt` find the rank instead"
    )]
    RankDeficient {
        /// The operation that was called.
        operation: &'static str,
        /// The number of columns.
        columns: usize,
        /// The numerical rank found, where the operation found one (else the columns that were
        /// factored before the breakdown).
        rank: usize,
    },

    /// An operation was asked for something it has no algorithm for.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked.
        what: String,
    },
}

impl LinalgError {
    /// [`LinalgError::InvalidConfig`] naming the first of `sizes` that is zero.
    pub(crate) fn first_zero(
        sizes: impl IntoIterator<Item = (&'static str, usize)>,
    ) -> Result<(), LinalgError> {
        match sizes.into_iter().find(|&(_, value)| value == 0) {
            Some((name, value)) => Err(LinalgError::InvalidConfig {
                name,
                value,
                reason: "must be at least 1",
            }),
            None => Ok(()),
        }
    }
}
