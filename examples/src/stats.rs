//! The small measurement helpers the examples and `xtask` share: the median of samples, a median
//! timer, and bytes in megabytes.
//!
//! The file uses only the standard library: `xtask`, which does not depend on the examples,
//! includes it as a module of its own (`#[path]`), so that both keep one copy.

use std::time::Instant;

/// One megabyte, as the examples and the book count them: 10⁶ bytes.
pub const MB: f64 = 1e6;

/// `bytes` in megabytes (10⁶ bytes).
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / MB
}

/// The median of `samples`: for an even count, the upper of the two middle values (the
/// element at `len / 2` once sorted). `NaN` for no samples.
pub fn median(samples: impl IntoIterator<Item = f64>) -> f64 {
    let mut samples: Vec<f64> = samples.into_iter().collect();
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Runs `f` `warmup` times untimed, then `runs` times timed: the [`median`] wall time of the
/// timed calls, in seconds. `f` must wait for the device itself where the backend is
/// asynchronous (a sync, or reading its output), or the clock times only the launches.
pub fn median_seconds(warmup: usize, runs: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    median((0..runs).map(|_| {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_sample_or_the_upper_middle_one() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median([]).is_nan());
    }

    #[test]
    fn the_timer_runs_the_warmup_untimed_and_the_runs_timed() {
        let mut calls = 0;
        let seconds = median_seconds(2, 5, || calls += 1);
        assert_eq!(calls, 7);
        assert!(seconds >= 0.0);
        assert_eq!(mb(2_500_000), 2.5);
    }
}
