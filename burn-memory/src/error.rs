//! The error type of the crate.

use std::path::PathBuf;

/// Why a memory operation could not be done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The backend could not report its memory (for example a CubeCL server error).
    #[error("the backend could not report its memory: {0}")]
    Backend(String),
    /// Process memory is not available on this platform.
    #[error("process memory cannot be read on this platform: {0}")]
    Unsupported(&'static str),
    /// A file could not be read or written.
    #[error("cannot write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("cannot draw the plot {path}: {message}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// What the plotting library said.
        message: String,
    },
    /// An argument was out of its range.
    #[error("invalid {name}: {message}")]
    Invalid {
        /// The argument.
        name: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The device cannot compute in the requested element type.
    #[error("the device does not support {0:?} arithmetic; use another precision or backend")]
    UnsupportedPrecision(burn::tensor::DType),
    /// The backend has no device to run on here (no driver for its graphics API).
    #[error("no {backend} device: {help}")]
    NoDevice {
        /// The backend, as on the command line (`wgpu`).
        backend: &'static str,
        /// What was looked for and what to install.
        help: String,
    },
    /// A file of the offload disk cache is missing, truncated or corrupted (its length or its
    /// CRC-32 is not the one written), or cannot be decoded.
    #[error("offload cache file {path}: {message}")]
    OffloadCache {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The disk cache has no room for a module and the host tier is off.
    #[error(
        "the offload disk cache is full: {needed} more bytes would pass max_disk_bytes ({limit}); \
         raise it or turn the host tier on"
    )]
    OffloadDiskFull {
        /// The bytes the module needs.
        needed: u64,
        /// The configured maximum.
        limit: u64,
    },
    /// A [`MemoryCap`](crate::MemoryCap) refused work: the memory it would use, or the peak
    /// it was measured to reach, passes the cap's limit.
    #[error(
        "over the memory cap: {needed} bytes would be used, more than the limit of {limit} \
         ({in_use} in use before); {what}"
    )]
    OverCap {
        /// The cap, in bytes.
        limit: u64,
        /// The figure that passed it: bytes in use plus the bytes asked for
        /// ([`MemoryCap::reserve`](crate::MemoryCap::reserve)), or the measured peak
        /// ([`MemoryCap::run`](crate::MemoryCap::run)).
        needed: u64,
        /// Bytes in use on the device when the check began.
        in_use: u64,
        /// What was refused.
        what: String,
    },
    /// A batch-size search found no batch size that fits.
    #[error("no batch size fits: the smallest tried, {batch_size}, {reason}")]
    NothingFits {
        /// The smallest batch size tried.
        batch_size: usize,
        /// Why it did not fit.
        reason: String,
    },
}

impl MemoryError {
    pub(crate) fn invalid(name: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            name,
            message: message.into(),
        }
    }
}
