//! What the kernels' tests and benchmarks share: seeded inputs, so that a failure reproduces
//! from its seed, and comparisons against `f64` references. Public because the benchmarks
//! (examples) and the CubeCL kernels' tests use them too; not meant for models.
//!
//! ```
//! use burn_cpu_kernels::testing;
//!
//! let x = testing::uniform(1000, 7, [-1.0, 1.0]);
//! assert_eq!(x, testing::uniform(1000, 7, [-1.0, 1.0]));
//! assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
//! let want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
//! assert_eq!(testing::largest_error(&x, &want), 0.0);
//! ```

use half::bf16;

/// SplitMix64's next value (Steele, Lea and Flood's generator: full period, every seed good).
fn split_mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` values drawn uniformly from `[low, high)`, the same for the same `seed`.
pub fn uniform(len: usize, seed: u64, [low, high]: [f32; 2]) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            // 24 random bits: every value of [0, 1) a multiple of 2⁻²⁴, exact in f32.
            let unit = (split_mix(&mut state) >> 40) as f32 / (1u64 << 24) as f32;
            low + (high - low) * unit
        })
        .collect()
}

/// [`uniform`] rounded to `bf16`.
pub fn uniform_bf16(len: usize, seed: u64, range: [f32; 2]) -> Vec<bf16> {
    uniform(len, seed, range)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

/// The largest `|got − want|`.
///
/// # Panics
/// If the slices differ in length.
pub fn largest_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "one result per reference value");
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max)
}

/// The largest `|got − want|` relative to the reference's largest magnitude (`0` for an empty
/// or all-zero reference with exact results): the measure a product's rounding is bounded
/// in, since its error grows with the sizes it sums, not with each output.
///
/// # Panics
/// If the slices differ in length.
pub fn relative_to_largest(got: &[f32], want: &[f64]) -> f64 {
    let error = largest_error(got, want);
    let scale = want.iter().fold(0.0f64, |s, w| s.max(w.abs()));
    if error == 0.0 { 0.0 } else { error / scale }
}

/// Asserts [`relative_to_largest`] within `tolerance`, naming `what` and the worst element.
///
/// # Panics
/// If it is not.
pub fn assert_close(got: &[f32], want: &[f64], tolerance: f64, what: &str) {
    let relative = relative_to_largest(got, want);
    if relative <= tolerance {
        return;
    }
    let (index, (g, w)) = got
        .iter()
        .zip(want)
        .enumerate()
        .max_by(|(_, (a, x)), (_, (b, y))| {
            (**a as f64 - **x)
                .abs()
                .total_cmp(&(**b as f64 - **y).abs())
        })
        .expect("a failing comparison has elements");
    panic!(
        "{what}: relative error {relative:.3e} above {tolerance:.1e} (worst at {index}: {g} \
         against {w})"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_seeded_and_in_range() {
        let a = uniform(4096, 1, [-2.0, 3.0]);
        assert_eq!(a, uniform(4096, 1, [-2.0, 3.0]));
        assert_ne!(a, uniform(4096, 2, [-2.0, 3.0]));
        assert!(a.iter().all(|v| (-2.0..3.0).contains(v)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 0.5).abs() < 0.1, "{mean}");
        assert_eq!(uniform_bf16(3, 1, [-2.0, 3.0])[0], bf16::from_f32(a[0]));
    }

    #[test]
    fn errors_are_relative_to_the_largest_reference_value() {
        assert_eq!(relative_to_largest(&[1.0, 2.5], &[1.0, 2.0]), 0.25);
        assert_eq!(relative_to_largest(&[0.0], &[0.0]), 0.0);
        assert_close(&[1.0, 2.0], &[1.0, 2.0 + 1e-9], 1e-6, "close");
    }

    #[test]
    #[should_panic(expected = "worst at 1")]
    fn a_failing_comparison_names_its_worst_element() {
        assert_close(&[1.0, 3.0], &[1.0, 2.0], 1e-6, "far");
    }
}
