//! What can go wrong when profiling.

use std::path::PathBuf;

/// Why a profiler could not start or write its results.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// A file could not be written.
    #[error("cannot write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An argument was out of its range.
    #[error("invalid {name}: {message}")]
    Invalid {
        /// The argument.
        name: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A profiler was started while another was running in the process.
    #[error("a profiler is already running in this process; stop it before starting another")]
    Running,
}
