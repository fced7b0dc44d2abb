//! Moving the small matrices of a factorisation between the device and the host, where faer
//! factors them in `f64`.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use faer::linalg::triangular_solve::solve_upper_triangular_in_place;
use faer::{Mat, MatRef, Par};

use crate::LinalgError;

/// The tensor's values in `f64`, or [`LinalgError::NonFinite`] if one is NaN or infinite.
pub fn to_host<B: Backend>(
    tensor: Tensor<B, 2>,
    operation: &'static str,
) -> Result<Mat<f64>, LinalgError> {
    let [rows, cols] = tensor.dims();
    let values: Vec<f64> = tensor.into_data().iter::<f64>().collect();
    if values.iter().any(|x| !x.is_finite()) {
        return Err(LinalgError::NonFinite { operation });
    }
    Ok(Mat::from_fn(rows, cols, |i, j| values[i * cols + j]))
}

/// The matrix as an `f32` tensor on `device`.
pub fn to_device<B: Backend>(matrix: MatRef<'_, f64>, device: &B::Device) -> Tensor<B, 2> {
    let (rows, cols) = (matrix.nrows(), matrix.ncols());
    let mut values = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        values.extend((0..cols).map(|j| matrix[(i, j)] as f32));
    }
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

/// `R⁻¹` of an upper-triangular `R` with a nonzero diagonal.
pub(crate) fn upper_inverse(r: MatRef<'_, f64>) -> Mat<f64> {
    let mut inverse = Mat::<f64>::identity(r.nrows(), r.ncols());
    solve_upper_triangular_in_place(r, inverse.as_mut(), Par::Seq);
    inverse
}

/// Refuses an empty matrix.
pub(crate) fn check_not_empty(
    operation: &'static str,
    shape: [usize; 2],
) -> Result<(), LinalgError> {
    if shape.contains(&0) {
        return Err(LinalgError::InvalidShape {
            operation,
            shape: shape.to_vec(),
            reason: "is empty".into(),
        });
    }
    Ok(())
}

/// The Moore–Penrose pseudo-inverse, from the SVD, singular values below `max(m, n)·ε_f32` of
/// the largest treated as zero (the inputs come from `f32` tensors).
pub fn pseudo_inverse(a: MatRef<'_, f64>) -> Result<Mat<f64>, LinalgError> {
    let svd = a.thin_svd().map_err(|_| LinalgError::NonFinite {
        operation: "pseudo-inverse",
    })?;
    let s = svd.S().column_vector();
    let cutoff = s[0].abs() * a.nrows().max(a.ncols()) as f64 * f64::from(f32::EPSILON);
    let (u, v) = (svd.U(), svd.V());
    Ok(Mat::from_fn(a.ncols(), a.nrows(), |i, j| {
        (0..s.nrows())
            .filter(|&t| s[t] > cutoff)
            .map(|t| v[(i, t)] * u[(j, t)] / s[t])
            .sum()
    }))
}
