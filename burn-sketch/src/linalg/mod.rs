//! Randomized linear algebra on Burn tensors (Panther's `pr.linalg`): factorisations whose
//! products with the large matrix run on the device, while the small matrices between them are
//! factored on the host in `f64` (faer).
//!
//! - [`qr`]: tall-skinny QR on the device (Cholesky QR, shifted when ill-conditioned);
//!   [`qr_pivoted`]: column-pivoted QR of a small matrix.
//! - [`range_finder`] and [`RandomizedSvdConfig`]: an orthonormal basis of a matrix's dominant
//!   range, and the rank-`k` SVD built on it.
//! - [`CqrrptConfig`]: pivoted QR of a tall matrix through a sketch, revealing its rank.
//!
//! Burn has no QR or SVD of its own; on the CPU backends the device is the host, and the split
//! costs two small copies per step.

mod cqrrpt;
pub(crate) mod host;
mod qr;
mod svd;

pub use cqrrpt::{Cqrrpt, CqrrptConfig};
pub use qr::{PivotedQr, Qr, qr, qr_pivoted};
pub use svd::{RandomizedSvdConfig, Svd, range_finder, singular_values};
