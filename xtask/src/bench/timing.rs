//! Wall-clock timing with warm-up and device synchronisation.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Summary of repeated timings, in milliseconds per call.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Timing {
    /// Median of the timed samples.
    pub median_ms: f64,
    /// First quartile.
    pub p25_ms: f64,
    /// Third quartile.
    pub p75_ms: f64,
    /// Number of timed samples.
    pub runs: usize,
    /// Calls queued back to back in each sample, before its one sync (see [`time`]).
    #[serde(default = "one")]
    pub calls_per_sample: usize,
}

fn one() -> usize {
    1
}

/// What one sample should last at least: long enough that the device sync ending it (about
/// 0.1 ms through Burn's CUDA backend, measured on an H100) is a small part of it.
const MIN_SAMPLE_MS: f64 = 2.0;

/// The most calls one sample queues (each holds its output until the sync).
const MAX_CALLS_PER_SAMPLE: usize = 32;

/// Times `op`: `warmup` untimed calls, then `runs` samples, each of which queues `op` some
/// number of times back to back, waits for the device with `sync`, and counts the elapsed
/// time divided by that number. GPU backends return before the work is done, so a clock read
/// without the sync would time only the launches.
///
/// The calls per sample are 1 on a CPU (where each call takes milliseconds) and more on a
/// GPU, for operations so short that a sync per call would time the sync: a model queues its
/// layers back to back and syncs rarely, and this measures that throughput. The number is
/// chosen once from a synced call and recorded with the timing.
///
/// `op`'s results are dropped only after the sync. On lazy backends (Burn's fusion wrapper,
/// which `Wgpu` and `Cuda` are by default) an operation whose output is dropped unread may
/// never run at all: measured on an H100, dropping dense `Linear`'s output before the sync
/// "timed" a 34 GFLOP forward at 0.05 ms, faster than the device's peak allows.
pub fn time<T>(warmup: usize, runs: usize, mut op: impl FnMut() -> T, sync: impl Fn()) -> Timing {
    for _ in 0..warmup {
        let output = op();
        sync();
        drop(output);
    }
    sync();
    let start = Instant::now();
    let output = op();
    sync();
    let once_ms = start.elapsed().as_secs_f64() * 1e3;
    drop(output);
    let calls = ((MIN_SAMPLE_MS / once_ms).ceil() as usize).clamp(1, MAX_CALLS_PER_SAMPLE);

    let mut samples: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            let outputs: Vec<T> = (0..calls).map(|_| op()).collect();
            sync();
            let elapsed = start.elapsed().as_secs_f64() * 1e3 / calls as f64;
            drop(outputs);
            elapsed
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Timing {
        median_ms: at(0.5),
        p25_ms: at(0.25),
        p75_ms: at(0.75),
        runs: samples.len(),
        calls_per_sample: calls,
    }
}
