//! Seeded inputs and comparisons shared by the tests.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// A seeded tensor of `shape` with values in `[-scale, scale]`.
pub fn seeded<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    scale: f32,
    device: &B::Device,
) -> Tensor<B, D> {
    let len: usize = shape.iter().product();
    let values: Vec<f32> = burn_cpu_kernels::testing::uniform(len, seed, [-scale, scale]);
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// The values of a tensor as `f64`.
pub fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f64> {
    tensor
        .cast(burn::tensor::DType::F32)
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .expect("f64 values")
}

/// Asserts that `actual` is within `tolerance` of `expected`, relative to the largest
/// `|expected|` (at least 1e-3: a gradient that is zero in exact arithmetic holds rounding
/// noise of the inputs' scale, about 1), with NaN only where `expected` has one.
pub fn assert_close<B: Backend, const D: usize>(
    actual: Tensor<B, D>,
    expected: Tensor<B, D>,
    tolerance: f64,
    what: &str,
) {
    assert_eq!(actual.dims(), expected.dims(), "{what}: shapes");
    let (a, e) = (values(actual), values(expected));
    let scale = e
        .iter()
        .filter(|v| v.is_finite())
        .fold(1e-3f64, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        if y.is_nan() || x.is_nan() {
            assert!(
                x.is_nan() && y.is_nan(),
                "{what}: [{i}] is {x}, expected {y}"
            );
            continue;
        }
        let err = (x - y).abs() / scale;
        assert!(
            err <= tolerance,
            "{what}: [{i}] is {x}, expected {y} (error {err:.2e} of {scale:.3e} > {tolerance:.0e})"
        );
    }
}
