//! Randomized numerical linear algebra on Burn tensors (Panther's `pr.sketch` and `pr.linalg`),
//! which Burn itself lacks: the products with the large matrix run on the device, the small
//! matrices between them are factored on the host in `f64` (faer).
//!
//! - [`sketch`]: sketching operators (Gaussian, sign, sparse sign, CountSketch, SRHT), random
//!   maps that shrink one side of a matrix while keeping its geometry.
//! - [`qr`]: tall-skinny QR on the device (Cholesky QR, shifted when ill-conditioned);
//!   [`qr_pivoted`]: column-pivoted QR of a small matrix.
//! - [`range_finder`] and [`RandomizedSvdConfig`]: an orthonormal basis of a matrix's dominant
//!   range, and the rank-`k` SVD built on it.
//! - [`CqrrptConfig`]: pivoted QR of a tall matrix through a sketch, revealing its rank.
//! - [`host`]: the moves between the device and faer's host matrices, and the pseudo-inverse.
//! - [`Draws`]: the seeded draws every sketch of the workspace comes from, so that a seed
//!   means the same values on every backend.
//!
//! Every operation returns a [`LinalgError`] for input it cannot take.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_randnla::{CqrrptConfig, RandomizedSvdConfig};
//!
//! let device = Default::default();
//! let a = Tensor::<Flex, 2>::random([200, 12], Distribution::Default, &device);
//! let qr = burn_randnla::qr(a.clone()).unwrap();
//! let back = qr.q.matmul(qr.r);
//! assert!(back.sub(a).abs().max().into_scalar() < 1e-4);
//!
//! // CQRRPT finds the rank: 40 columns spanning a 25-dimensional space.
//! let a = Tensor::<Flex, 2>::random([2000, 25], Distribution::Default, &device)
//!     .matmul(Tensor::random([25, 40], Distribution::Default, &device));
//! let qr = CqrrptConfig::new().decompose(a).unwrap();
//! assert_eq!(qr.rank, 25);
//! assert_eq!(qr.q.dims(), [2000, 25]);
//! assert_eq!(qr.r.dims(), [25, 40]);
//!
//! // A rank-5 matrix: its rank-5 randomized SVD is exact.
//! let a = Tensor::<Flex, 2>::random([300, 5], Distribution::Default, &device)
//!     .matmul(Tensor::random([5, 200], Distribution::Default, &device));
//! let svd = RandomizedSvdConfig::new(5).decompose(a.clone()).unwrap();
//! assert_eq!(svd.u.dims(), [300, 5]);
//! let error = (svd.reconstruct() - a.clone()).powi_scalar(2).sum().sqrt().into_scalar();
//! let norm = a.powi_scalar(2).sum().sqrt().into_scalar();
//! assert!(error / norm < 1e-4);
//! ```

#![warn(missing_docs)]

mod cqrrpt;
pub mod draws;
mod error;
pub mod host;
mod qr;
pub mod sketch;
mod svd;

pub use cqrrpt::{Cqrrpt, CqrrptConfig};
pub use draws::Draws;
pub use error::LinalgError;
pub use qr::{PivotedQr, Qr, qr, qr_pivoted};
pub use svd::{RandomizedSvdConfig, Svd, range_finder, singular_values};
