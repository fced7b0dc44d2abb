//! Wall-clock timing with warm-up and device synchronisation.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Summary of repeated timings, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Timing {
    /// Median of the timed runs.
    pub median_ms: f64,
    /// First quartile.
    pub p25_ms: f64,
    /// Third quartile.
    pub p75_ms: f64,
    /// Number of timed runs.
    pub runs: usize,
}

/// Runs `op` `warmup` times untimed, then `runs` times timed. Each run ends with `sync`, which
/// waits for the device to finish the work `op` queued: GPU backends return before the work is
/// done, and a clock read without it would time only the launch.
pub fn time(warmup: usize, runs: usize, mut op: impl FnMut(), sync: impl Fn()) -> Timing {
    for _ in 0..warmup {
        op();
        sync();
    }
    sync();
    let mut samples: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            op();
            sync();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Timing {
        median_ms: at(0.5),
        p25_ms: at(0.25),
        p75_ms: at(0.75),
        runs: samples.len(),
    }
}
