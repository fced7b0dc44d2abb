//! Comparisons of tensors within a tolerance, and the lock of tests that use a backend's global
//! random generator: shared by the crates' test binaries (`#[path]`-included).

#![allow(dead_code)]

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// The backend's random generator is global: tests that seed it or draw from it hold this
/// lock, so that the test harness's threads cannot interleave their draws.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The relative tolerance of [`assert_close`], as `f32` bits (default `1e-4`). The CUDA suite
/// raises it: Burn's CUDA matmul computes `f32` products on TF32 tensor cores (10-bit
/// mantissa), so the tensor-op references differ from the kernels' exact `f32` sums by about
/// `4e-4` of the output's scale (measured on an H100); the kernels themselves are held to
/// `1e-4` against an `f64` reference in burn-sketch-kernels' own tests.
pub static TOLERANCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0x38d1b717);

pub fn assert_close(actual: TensorData, expected: TensorData, what: &str) {
    let tolerance = f32::from_bits(TOLERANCE.load(std::sync::atomic::Ordering::Relaxed));
    assert_close_within(actual, expected, tolerance, what);
}

/// [`assert_close`] with an explicit relative tolerance, for the few comparisons whose
/// references differ from the result by more than rounding (stated where used).
pub fn assert_close_within(actual: TensorData, expected: TensorData, tolerance: f32, what: &str) {
    let actual = actual.convert::<f32>();
    let expected = expected.convert::<f32>();
    assert_eq!(actual.shape, expected.shape, "{what}: shapes differ");
    let a = actual.to_vec::<f32>().unwrap();
    let e = expected.to_vec::<f32>().unwrap();
    let scale = e.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        assert!(
            (x - y).abs() <= tolerance * scale + 1e-6,
            "{what}: element {i} is {x}, expected {y} (scale {scale})"
        );
    }
}

/// A tensor's values as `f32`, row-major.
pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

/// The largest `|a − b|` over the largest `|b|`.
pub fn relative_gap<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
    let (a, b) = (values(a), values(b));
    let scale = b.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}
