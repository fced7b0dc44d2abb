//! CQRRPT: Cholesky QR with randomization and pivoting for tall matrices (Melnichenko et al.
//! 2023), the pivoted QR Panther's `pr.linalg.cqrrpt` computes.

use super::host::{check_not_empty, to_device, to_host, upper_inverse};
use super::qr::cholesky_qr;
use crate::LinalgError;
use crate::sketch::{SketchConfig, SketchKind};
use burn::config::Config;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// `A·P ≈ Q·R` of numerical rank `rank`.
#[derive(Clone, Debug)]
pub struct Cqrrpt<B: Backend> {
    /// `[m, rank]`, orthonormal columns.
    pub q: Tensor<B, 2>,
    /// `[rank, n]`, upper trapezoidal: `A`'s columns in pivot order, as combinations of `q`.
    pub r: Tensor<B, 2>,
    /// `pivots[j]` is the column of `A` that is column `j` of `A·P`.
    pub pivots: Vec<usize>,
    /// The numerical rank found: the first `rank` pivoted columns span `A`'s range to the
    /// tolerance.
    pub rank: usize,
}

/// Configuration of a CQRRPT factorisation: a column-pivoted QR of a tall matrix that also
/// finds its numerical rank, with the large products on the device and only sketch-sized
/// factorisations on the host (the [crate docs](crate) have an example).
#[derive(Config, Debug)]
pub struct CqrrptConfig {
    /// `γ`: the sketch has `⌈γ·n⌉` rows (at least `n`).
    #[config(default = 1.25)]
    pub sketch_factor: f64,
    /// The sparse sign sketch's nonzeros per column (at most the sketch's rows).
    #[config(default = 8)]
    pub nonzeros: usize,
    /// A pivot of the sketch's QR below `tolerance × |first pivot|` ends the rank.
    #[config(default = 1e-5)]
    pub tolerance: f64,
    /// The sketch's seed.
    #[config(default = 0)]
    pub seed: u64,
}

impl CqrrptConfig {
    /// Factors the tall matrix `a` (`m ≥ n`) as `A·P = Q·R` and finds its numerical rank `k`:
    /// a sparse sketch's pivoted QR picks the pivots and the rank, then a Cholesky QR that it
    /// preconditions makes `Q` in one pass (the steps: the book's "Randomized linear algebra").
    ///
    /// # Shapes
    /// - a: `[m, n]`, `m ≥ n`; q: `[m, k]`, r: `[k, n]`, pivots: `n`
    ///
    /// # Errors
    /// [`LinalgError::InvalidShape`] for an empty or wide matrix, [`LinalgError::NonFinite`],
    /// [`LinalgError::RankDeficient`] with rank 0 for a zero matrix,
    /// [`LinalgError::Unsupported`] for a `sketch_factor` below 1 or a negative `tolerance`.
    pub fn decompose<B: Backend>(&self, a: Tensor<B, 2>) -> Result<Cqrrpt<B>, LinalgError> {
        const OPERATION: &str = "linalg::CqrrptConfig::decompose";
        let [m, n] = a.dims();
        check_not_empty(OPERATION, [m, n])?;
        if m < n {
            return Err(LinalgError::InvalidShape {
                operation: OPERATION,
                shape: vec![m, n],
                reason: "is wide: CQRRPT needs at least as many rows as columns (use \
                         `linalg::qr_pivoted`)"
                    .into(),
            });
        }
        if !(self.sketch_factor >= 1.0 && self.sketch_factor.is_finite()) {
            return Err(LinalgError::Unsupported {
                what: format!(
                    "CQRRPT with sketch_factor = {} (at least 1)",
                    self.sketch_factor
                ),
            });
        }
        if self.tolerance.is_nan() || self.tolerance < 0.0 {
            return Err(LinalgError::Unsupported {
                what: format!("CQRRPT with tolerance = {} (at least 0)", self.tolerance),
            });
        }
        let device = a.device();

        // 1. The sketch (none when it would not be smaller than `A`).
        let d = ((self.sketch_factor * n as f64).ceil() as usize).max(n);
        let sketched = if d < m {
            SketchConfig::new(
                SketchKind::SparseSign {
                    nonzeros: self.nonzeros.clamp(1, d),
                },
                m,
                d,
            )
            .with_seed(self.seed)
            .try_init::<B>(&device)?
            .apply_left(a.clone())?
        } else {
            a.clone()
        };

        // 2. Its pivoted QR and the rank it shows.
        let factor = to_host(sketched, OPERATION)?.col_piv_qr();
        let r_sketch = factor.thin_R().to_owned();
        let pivots = factor.P().arrays().0.to_vec();
        let first = r_sketch[(0, 0)].abs();
        let mut rank = (0..n)
            .take_while(|&i| r_sketch[(i, i)].abs() > self.tolerance * first)
            .count();
        if first == 0.0 || rank == 0 {
            return Err(LinalgError::RankDeficient {
                operation: OPERATION,
                columns: n,
                rank: 0,
            });
        }

        // 3. Precondition, then Cholesky QR, refining the rank.
        let (q, r_cholesky) = loop {
            let index: Vec<i64> = pivots[..rank].iter().map(|&j| j as i64).collect();
            let columns = a.clone().select(
                1,
                Tensor::<B, 1, Int>::from_data(TensorData::new(index, [rank]), &device),
            );
            let r11_inverse = upper_inverse(r_sketch.get(..rank, ..rank));
            let preconditioned = columns.matmul(to_device(r11_inverse.as_ref(), &device));
            match cholesky_qr(preconditioned, OPERATION) {
                Ok(factor) => break factor,
                Err(LinalgError::RankDeficient { rank: refined, .. }) if refined > 0 => {
                    tracing::debug!(from = rank, to = refined, "CQRRPT refined the rank");
                    rank = refined;
                }
                Err(LinalgError::RankDeficient { .. }) => {
                    return Err(LinalgError::RankDeficient {
                        operation: OPERATION,
                        columns: n,
                        rank: 0,
                    });
                }
                Err(err) => return Err(err),
            }
        };
        let r = &r_cholesky * r_sketch.get(..rank, ..);
        Ok(Cqrrpt {
            q,
            r: to_device(r.as_ref(), &device),
            pivots,
            rank,
        })
    }
}
