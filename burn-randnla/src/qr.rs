//! QR factorisations: tall-skinny on the device (Cholesky QR), column-pivoted on the host.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use faer::linalg::cholesky::llt::factor::LltError;
use faer::{Mat, Side};

use super::host::{check_not_empty, to_device, to_host, upper_inverse};
use crate::LinalgError;

/// `A = Q·R`: `Q` with orthonormal columns, `R` upper triangular.
#[derive(Clone, Debug)]
pub struct Qr<B: Backend> {
    /// `[m, n]`, orthonormal columns.
    pub q: Tensor<B, 2>,
    /// `[n, n]`, upper triangular.
    pub r: Tensor<B, 2>,
}

/// `A·P = Q·R` with column pivoting: `A`'s columns in the order `pivots`.
#[derive(Clone, Debug)]
pub struct PivotedQr<B: Backend> {
    /// `[m, min(m, n)]`, orthonormal columns.
    pub q: Tensor<B, 2>,
    /// `[min(m, n), n]`, upper triangular, its diagonal non-increasing in magnitude.
    pub r: Tensor<B, 2>,
    /// `pivots[j]` is the column of `A` that is column `j` of `A·P`.
    pub pivots: Vec<usize>,
}

/// The most Cholesky passes [`qr`] makes before it calls the matrix rank-deficient.
const MAX_PASSES: usize = 4;

/// A pass whose input is this close to orthonormal (`‖QᵀQ − I‖_F`) leaves it orthonormal to
/// working precision, so it is the last one.
const LAST_PASS_DEPARTURE: f64 = 0.5;

/// The unit roundoff of the device's `f32` products, for the shift.
const UNIT_ROUNDOFF: f64 = f32::EPSILON as f64 / 2.0;

/// QR of a tall-skinny matrix (`m ≥ n`) on the device: Cholesky QR repeated until `Q` is
/// orthonormal, so `A` never leaves the device and there is no panel loop, unlike Householder
/// QR (the passes, and the conditioning they handle: the book's "Randomized linear algebra").
///
/// # Shapes
/// - a: `[m, n]`, `m ≥ n`; q: `[m, n]`; r: `[n, n]`
///
/// # Errors
/// [`LinalgError::InvalidShape`] for an empty or wide matrix, [`LinalgError::NonFinite`],
/// [`LinalgError::RankDeficient`] when the columns are numerically dependent (use
/// [`qr_pivoted`] or [`Cqrrpt`](super::Cqrrpt), which find the rank).
pub fn qr<B: Backend>(a: Tensor<B, 2>) -> Result<Qr<B>, LinalgError> {
    const OPERATION: &str = "linalg::qr";
    let device = a.device();
    let (q, r) = cholesky_qr(a, OPERATION)?;
    Ok(Qr {
        q,
        r: to_device(r.as_ref(), &device),
    })
}

/// [`qr`]'s passes, with `R` left on the host.
pub(crate) fn cholesky_qr<B: Backend>(
    a: Tensor<B, 2>,
    operation: &'static str,
) -> Result<(Tensor<B, 2>, Mat<f64>), LinalgError> {
    let [m, n] = a.dims();
    check_not_empty(operation, [m, n])?;
    if m < n {
        return Err(LinalgError::InvalidShape {
            operation,
            shape: vec![m, n],
            reason: "is wide: Cholesky QR needs at least as many rows as columns (use \
                     `linalg::qr_pivoted`)"
                .into(),
        });
    }
    let device = a.device();
    let mut q = a;
    let mut gram = to_host(q.clone().transpose().matmul(q.clone()), operation)?;
    let mut r_total = Mat::<f64>::identity(n, n);
    for pass in 0..MAX_PASSES {
        let last = pass > 0 && departure(&gram) <= LAST_PASS_DEPARTURE;
        let r = cholesky_factor(gram, m, operation)?;
        q = q.matmul(to_device(upper_inverse(r.as_ref()).as_ref(), &device));
        r_total = &r * &r_total;
        if last {
            // Orthonormal, but a column of `A` that is (to rounding) a combination of the
            // others has become noise: its pivot in `R` is at rounding level.
            let pivots: Vec<f64> = (0..n).map(|i| r_total[(i, i)].abs()).collect();
            let largest = pivots.iter().cloned().fold(0.0, f64::max);
            let rank = pivots
                .iter()
                .filter(|&&p| p > n as f64 * UNIT_ROUNDOFF * largest)
                .count();
            if rank < n {
                return Err(LinalgError::RankDeficient {
                    operation,
                    columns: n,
                    rank,
                });
            }
            return Ok((q, r_total));
        }
        gram = to_host(q.clone().transpose().matmul(q.clone()), operation)?;
    }
    // Still far from orthonormal after every pass: the columns are numerically dependent.
    let scale = (0..n).map(|i| r_total[(i, i)].abs()).fold(0.0, f64::max);
    let rank = (0..n)
        .filter(|&i| r_total[(i, i)].abs() > scale * f64::from(f32::EPSILON) * n as f64)
        .count();
    Err(LinalgError::RankDeficient {
        operation,
        columns: n,
        rank,
    })
}

/// `‖G − I‖_F`.
fn departure(gram: &Mat<f64>) -> f64 {
    (gram - Mat::<f64>::identity(gram.nrows(), gram.ncols())).norm_l2()
}

/// The upper Cholesky factor `R` of a Gram matrix `G = QᵀQ` of `m` rows (`G = RᵀR`); where
/// the `f32` Gram matrix is too ill-conditioned to factor, that of the shifted `G + s·I`, with
/// `s = 11·(m·n + n·(n+1))·u·‖Q‖²` and `‖Q‖₂² ≤ trace(G)`, which cannot break down.
fn cholesky_factor(
    mut gram: Mat<f64>,
    m: usize,
    operation: &'static str,
) -> Result<Mat<f64>, LinalgError> {
    let n = gram.nrows();
    let factor = match gram.llt(Side::Lower) {
        Ok(factor) => factor,
        Err(_) => {
            let trace: f64 = (0..n).map(|i| gram[(i, i)]).sum();
            let shift = 11.0 * (m * n + n * (n + 1)) as f64 * UNIT_ROUNDOFF * trace;
            (0..n).for_each(|i| gram[(i, i)] += shift);
            gram.llt(Side::Lower)
                .map_err(
                    |LltError::NonPositivePivot { index }| LinalgError::RankDeficient {
                        operation,
                        columns: n,
                        rank: index,
                    },
                )?
        }
    };
    Ok(factor.L().transpose().to_owned())
}

/// An orthonormal basis of the range of a tall matrix of full column rank, or of a space
/// containing its range when it lacks it (the range finder's sketch of a matrix of rank below
/// the sketch size): Cholesky QR, and Householder QR on the host in the rank-deficient case.
pub(crate) fn orthonormal_basis<B: Backend>(
    y: Tensor<B, 2>,
    operation: &'static str,
) -> Result<Tensor<B, 2>, LinalgError> {
    match cholesky_qr(y.clone(), operation) {
        Ok((q, _)) => Ok(q),
        Err(LinalgError::RankDeficient { .. }) => {
            let device = y.device();
            let host = to_host(y, operation)?;
            Ok(to_device(host.qr().compute_thin_Q().as_ref(), &device))
        }
        Err(err) => Err(err),
    }
}

/// QR with column pivoting (Businger–Golub, Householder reflections, on the host in `f64`),
/// for the small matrices randomized algorithms produce: a sketch `[d, n]` or a projection.
/// The pivots put the most independent columns first, so `|R[i][i]|` falls with `i` and its
/// fall reveals the numerical rank.
///
/// # Shapes
/// - a: `[m, n]`, any aspect
/// - q: `[m, min(m, n)]`; r: `[min(m, n), n]`; pivots: `n`
///
/// # Errors
/// [`LinalgError::InvalidShape`] for an empty matrix, [`LinalgError::NonFinite`].
pub fn qr_pivoted<B: Backend>(a: Tensor<B, 2>) -> Result<PivotedQr<B>, LinalgError> {
    const OPERATION: &str = "linalg::qr_pivoted";
    check_not_empty(OPERATION, a.dims())?;
    let device = a.device();
    let host = to_host(a, OPERATION)?;
    let factor = host.col_piv_qr();
    Ok(PivotedQr {
        q: to_device(factor.compute_thin_Q().as_ref(), &device),
        r: to_device(factor.thin_R(), &device),
        pivots: factor.P().arrays().0.to_vec(),
    })
}
