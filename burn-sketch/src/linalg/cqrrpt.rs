//! CQRRPT: Cholesky QR with randomization and pivoting for tall matrices (Melnichenko et al.
//! 2023), the pivoted QR Panther's `pr.linalg.cqrrpt` computes.

use super::host::{check_not_empty, to_device, to_host, upper_inverse};
use super::qr::cholesky_qr;
use crate::SketchError;
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

/// Configuration of a CQRRPT factorisation.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::{Distribution, Tensor};
/// use burn_sketch::linalg::CqrrptConfig;
///
/// let device = Default::default();
/// // 40 columns spanning a 25-dimensional space.
/// let a = Tensor::<Flex, 2>::random([2000, 25], Distribution::Default, &device)
///     .matmul(Tensor::random([25, 40], Distribution::Default, &device));
/// let qr = CqrrptConfig::new().decompose(a).unwrap();
/// assert_eq!(qr.rank, 25);
/// assert_eq!(qr.q.dims(), [2000, 25]);
/// assert_eq!(qr.r.dims(), [25, 40]);
/// ```
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
    /// Factors the tall matrix `a` (`m ≥ n`).
    ///
    /// 1. Sketch: `Â = S·A`, `[d, n]` with `d = ⌈γ·n⌉`, a sparse sign sketch (one scatter-add
    ///    pass over `A` on the device).
    /// 2. Pivoted QR of the small `Â` on the host: `Â·P = Q̂·R̂`. Its pivots choose `A`'s
    ///    columns, its diagonal the rank `k`.
    /// 3. Precondition: `A_pre = A_P[:, :k]·R̂₁₁⁻¹` is well conditioned, because `S` embeds `A`'s
    ///    range almost isometrically, so Cholesky QR of it is accurate in one pass:
    ///    `A_preᵀ·A_pre = Rcᵀ·Rc`, `Q = A_pre·Rc⁻¹`, `R = Rc·R̂[:k, :]`. A Cholesky pivot that
    ///    shows a dependent column lowers `k` (rank refinement) and the step is redone.
    ///
    /// The device does one sketch pass, one Gram product and two `[m, k]·[k, k]` products; the
    /// host factors `d × n` and `k × k` matrices.
    ///
    /// # Shapes
    /// - a: `[m, n]`, `m ≥ n`
    /// - q: `[m, k]`, r: `[k, n]`, pivots: `n`
    ///
    /// # Errors
    /// [`SketchError::InvalidShape`] for an empty or wide matrix, [`SketchError::NonFinite`],
    /// [`SketchError::RankDeficient`] with rank 0 for a zero matrix,
    /// [`SketchError::Unsupported`] for a `sketch_factor` below 1 or a negative `tolerance`.
    pub fn decompose<B: Backend>(&self, a: Tensor<B, 2>) -> Result<Cqrrpt<B>, SketchError> {
        const OPERATION: &str = "linalg::CqrrptConfig::decompose";
        let [m, n] = a.dims();
        check_not_empty(OPERATION, [m, n])?;
        if m < n {
            return Err(SketchError::InvalidShape {
                operation: OPERATION,
                shape: vec![m, n],
                reason: "is wide: CQRRPT needs at least as many rows as columns (use \
                         `linalg::qr_pivoted`)"
                    .into(),
            });
        }
        if !(self.sketch_factor >= 1.0 && self.sketch_factor.is_finite()) {
            return Err(SketchError::Unsupported {
                what: format!(
                    "CQRRPT with sketch_factor = {} (at least 1)",
                    self.sketch_factor
                ),
            });
        }
        if self.tolerance.is_nan() || self.tolerance < 0.0 {
            return Err(SketchError::Unsupported {
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
            return Err(SketchError::RankDeficient {
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
                Err(SketchError::RankDeficient { rank: refined, .. }) if refined > 0 => {
                    tracing::debug!(from = rank, to = refined, "CQRRPT refined the rank");
                    rank = refined;
                }
                Err(SketchError::RankDeficient { .. }) => {
                    return Err(SketchError::RankDeficient {
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
