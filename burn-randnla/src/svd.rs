//! The randomized range finder and the randomized SVD (Halko, Martinsson and Tropp 2011).

use burn::config::Config;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use faer::Mat;

use super::host::{check_not_empty, to_device, to_host};
use super::qr::orthonormal_basis;
use crate::LinalgError;
use crate::sketch::{SketchConfig, SketchKind};

/// `A ≈ U·diag(s)·Vᵀ`, truncated to `k` terms.
#[derive(Clone, Debug)]
pub struct Svd<B: Backend> {
    /// `[m, k]`, orthonormal columns: the left singular vectors.
    pub u: Tensor<B, 2>,
    /// `[k]`, non-increasing, non-negative: the singular values.
    pub s: Tensor<B, 1>,
    /// `[n, k]`, orthonormal columns: the right singular vectors.
    pub v: Tensor<B, 2>,
}

impl<B: Backend> Svd<B> {
    /// `U·diag(s)·Vᵀ`, `[m, n]`.
    pub fn reconstruct(&self) -> Tensor<B, 2> {
        (self.u.clone() * self.s.clone().unsqueeze_dim(0)).matmul(self.v.clone().transpose())
    }
}

/// Configuration of the randomized SVD of rank `rank`: the dominant singular triplets of a
/// large matrix at the cost of a few products with it, instead of a full SVD on the host (the
/// [crate docs](crate) have an example).
#[derive(Config, Debug)]
pub struct RandomizedSvdConfig {
    /// `k`, the number of singular triplets kept, `1..=min(m, n)`.
    pub rank: usize,
    /// `p`: the range is sampled with `k + p` random vectors, so that the top `k` directions
    /// are caught with high probability.
    #[config(default = 10)]
    pub oversampling: usize,
    /// `q`: each power iteration multiplies by `A·Aᵀ` once, raising the spectrum's decay to the
    /// power `2q + 1` (re-orthonormalised after each product, so small singular values survive).
    #[config(default = 2)]
    pub power_iterations: usize,
    /// The seed of the Gaussian test matrix.
    #[config(default = 0)]
    pub seed: u64,
}

impl RandomizedSvdConfig {
    /// The rank-`k` approximate SVD of `a`: an orthonormal basis `Q` of `A`'s dominant range
    /// from the range finder, then the exact SVD of the small `Qᵀ·A` on the host (the steps
    /// and their cost are in the book's "Randomized linear algebra").
    ///
    /// # Shapes
    /// - a: `[m, n]`
    /// - u: `[m, k]`, s: `[k]`, v: `[n, k]`
    ///
    /// # Errors
    /// [`LinalgError::InvalidConfig`] for `rank` outside `1..=min(m, n)`,
    /// [`LinalgError::InvalidShape`] for an empty matrix, [`LinalgError::NonFinite`].
    pub fn decompose<B: Backend>(&self, a: Tensor<B, 2>) -> Result<Svd<B>, LinalgError> {
        const OPERATION: &str = "linalg::RandomizedSvdConfig::decompose";
        let [m, n] = a.dims();
        check_not_empty(OPERATION, [m, n])?;
        let smaller = m.min(n);
        if self.rank == 0 || self.rank > smaller {
            return Err(LinalgError::InvalidConfig {
                name: "rank",
                value: self.rank,
                reason: "must be in 1..=min(rows, columns)",
            });
        }
        if m < n {
            let Svd { u, s, v } = self.decompose(a.transpose())?;
            return Ok(Svd { u: v, s, v: u });
        }
        let device = a.device();
        let size = (self.rank + self.oversampling).min(smaller);
        let q = find_range(a.clone(), size, self.power_iterations, self.seed, OPERATION)?;
        // Bᵀ = Aᵀ·Q, [n, l]: the host factors the transpose, tall like Q.
        let bt = to_host(a.transpose().matmul(q.clone()), OPERATION)?;
        let svd = bt.thin_svd().map_err(|_| LinalgError::NonFinite {
            operation: OPERATION,
        })?;
        // Bᵀ = V·Σ·Ũᵀ: B's right vectors are Bᵀ's left ones.
        let k = self.rank;
        let v = svd.U().get(.., ..k);
        let u_small = svd.V().get(.., ..k);
        let s: Vec<f32> = (0..k).map(|i| svd.S().column_vector()[i] as f32).collect();
        Ok(Svd {
            u: q.matmul(to_device(u_small, &device)),
            s: Tensor::from_data(burn::tensor::TensorData::new(s, [k]), &device),
            v: to_device(v, &device),
        })
    }
}

/// An orthonormal basis `Q` (`[m, size]`) of the range of `A·Ω` for a Gaussian `Ω`
/// (`[n, size]`, from `seed`), with `power_iterations` products by `A·Aᵀ`, each
/// re-orthonormalised.
///
/// # Shapes
/// - a: `[m, n]`, `size ≤ min(m, n)`
/// - output: `[m, size]`
///
/// # Errors
/// As [`RandomizedSvdConfig::decompose`], for `size`.
pub fn range_finder<B: Backend>(
    a: Tensor<B, 2>,
    size: usize,
    power_iterations: usize,
    seed: u64,
) -> Result<Tensor<B, 2>, LinalgError> {
    find_range(a, size, power_iterations, seed, "linalg::range_finder")
}

fn find_range<B: Backend>(
    a: Tensor<B, 2>,
    size: usize,
    power_iterations: usize,
    seed: u64,
    operation: &'static str,
) -> Result<Tensor<B, 2>, LinalgError> {
    let [m, n] = a.dims();
    check_not_empty(operation, [m, n])?;
    if size == 0 || size > m.min(n) {
        return Err(LinalgError::InvalidConfig {
            name: "size",
            value: size,
            reason: "must be in 1..=min(rows, columns)",
        });
    }
    let omega = SketchConfig::new(SketchKind::Gaussian, n, size)
        .with_seed(seed)
        .try_init::<B>(&a.device())?;
    let mut q = orthonormal_basis(omega.apply_right(a.clone())?, operation)?;
    for _ in 0..power_iterations {
        let z = orthonormal_basis(a.clone().transpose().matmul(q), operation)?;
        q = orthonormal_basis(a.clone().matmul(z), operation)?;
    }
    Ok(q)
}

/// The singular values of `a`, all of them, exactly (on the host in `f64`): the reference the
/// randomized SVD's accuracy is measured against.
///
/// # Errors
/// [`LinalgError::InvalidShape`] for an empty matrix, [`LinalgError::NonFinite`].
pub fn singular_values<B: Backend>(a: Tensor<B, 2>) -> Result<Vec<f64>, LinalgError> {
    const OPERATION: &str = "linalg::singular_values";
    check_not_empty(OPERATION, a.dims())?;
    let host: Mat<f64> = to_host(a, OPERATION)?;
    host.singular_values().map_err(|_| LinalgError::NonFinite {
        operation: OPERATION,
    })
}
