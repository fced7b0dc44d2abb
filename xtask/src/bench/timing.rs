//! Wall-clock timing with warm-up and device synchronisation.

use std::any::Any;
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
    /// Calls queued back to back in each sample, before its one sync (see [`time_together`]).
    #[serde(default = "one")]
    pub calls_per_sample: usize,
}

fn one() -> usize {
    1
}

/// What one sample should last at least: long enough that the device sync ending it (a
/// fraction of a millisecond through Burn's CUDA backend) is a small part of it.
const MIN_SAMPLE_MS: f64 = 2.0;

/// The most calls one sample queues (each holds its output until the sync).
const MAX_CALLS_PER_SAMPLE: usize = 32;

/// One operation to time. Its output is boxed so that operations with different outputs can
/// be timed together, and kept until the sync that ends its sample.
pub type Op<'a> = Box<dyn FnMut() -> Box<dyn Any> + 'a>;

/// `f` as an [`Op`].
pub fn op<'a, T: 'static>(mut f: impl FnMut() -> T + 'a) -> Op<'a> {
    Box::new(move || Box::new(f()) as Box<dyn Any>)
}

/// Times each of `ops`: `warmup` untimed calls each, then `runs` rounds in which every op in
/// turn takes one sample. A sample queues the op some number of times back to back, waits for
/// the device with `sync`, and counts the elapsed time divided by that number. GPU backends
/// return before the work is done, so a clock read without the sync would time only the
/// launches.
///
/// Why rounds rather than one op's samples after another's: the speedups in the table are
/// ratios of these timings, and a shared machine's speed drifts over seconds. Timed one after
/// the other, a fast op's samples all fall in a fraction of a second, and a neighbour's burst
/// there moves its speedup from one run to the next (the book's CPU benchmark page has the
/// figures). In rounds, every op's samples spread over the whole measurement.
/// Each sample follows an untimed call of the same op, so that the caches hold what that op
/// uses, as when it runs back to back, rather than what the op before it left there.
///
/// The calls per sample are 1 on a CPU (where each call takes milliseconds) and more on a
/// GPU, for operations so short that a sync per call would time the sync: a model queues its
/// layers back to back and syncs rarely, and this measures that throughput. The number is
/// chosen once per op from a synced call and recorded with its timing.
///
/// Outputs are dropped only after the sync. On lazy backends (Burn's fusion wrapper, which
/// `Wgpu` and `Cuda` are by default) an operation whose output is dropped unread may never
/// run at all: dropping dense `Linear`'s output before the sync once "timed" a forward faster
/// than the device's peak allows.
pub fn time_together<const N: usize>(
    warmup: usize,
    runs: usize,
    mut ops: [Op<'_>; N],
    sync: impl Fn(),
) -> [Timing; N] {
    let untimed = |op: &mut Op<'_>| {
        let output = op();
        sync();
        drop(output);
    };
    let calls = ops.each_mut().map(|op| {
        for _ in 0..warmup {
            untimed(op);
        }
        sync();
        let start = Instant::now();
        untimed(op);
        let once_ms = start.elapsed().as_secs_f64() * 1e3;
        ((MIN_SAMPLE_MS / once_ms).ceil() as usize).clamp(1, MAX_CALLS_PER_SAMPLE)
    });

    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(runs));
    for _ in 0..runs.max(1) {
        for ((op, &calls), samples) in ops.iter_mut().zip(&calls).zip(&mut samples) {
            untimed(op);
            let start = Instant::now();
            let outputs: Vec<Box<dyn Any>> = (0..calls).map(|_| op()).collect();
            sync();
            samples.push(start.elapsed().as_secs_f64() * 1e3 / calls as f64);
            drop(outputs);
        }
    }
    std::array::from_fn(|i| {
        let samples = &mut samples[i];
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Timing {
            median_ms: at(0.5),
            p25_ms: at(0.25),
            p75_ms: at(0.75),
            runs: samples.len(),
            calls_per_sample: calls[i],
        }
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;

    /// An output that counts how many of its kind are alive.
    struct Output(Rc<RefCell<usize>>);

    impl Drop for Output {
        fn drop(&mut self) {
            *self.0.borrow_mut() -= 1;
        }
    }

    #[test]
    fn ops_take_turns_and_their_outputs_outlive_the_sync() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let alive = Rc::new(RefCell::new(0));
        let alive_at_sync = RefCell::new(Vec::new());
        let timed = |id: usize, sleep: Duration| {
            let (log, alive) = (log.clone(), alive.clone());
            op(move || {
                log.borrow_mut().push(id);
                std::thread::sleep(sleep);
                *alive.borrow_mut() += 1;
                Output(alive.clone())
            })
        };
        let [fast, slow] = time_together(
            1,
            3,
            [timed(0, Duration::ZERO), timed(1, Duration::from_millis(3))],
            || alive_at_sync.borrow_mut().push(*alive.borrow()),
        );

        // A call far below 2 ms is queued the most times per sample; one of 3 ms once.
        assert_eq!(fast.calls_per_sample, MAX_CALLS_PER_SAMPLE);
        assert_eq!(slow.calls_per_sample, 1);
        assert_eq!((fast.runs, slow.runs), (3, 3));
        assert!(
            slow.p25_ms >= 3.0 && slow.median_ms <= slow.p75_ms,
            "{slow:?}"
        );
        assert!(fast.median_ms < 3.0, "{fast:?}");

        // Warm-up and calibration of each op, then rounds: each op's untimed call and its
        // sample, in turn.
        let mut expected = vec![0, 0, 1, 1];
        for _ in 0..3 {
            expected.extend(std::iter::repeat_n(0, 1 + MAX_CALLS_PER_SAMPLE));
            expected.extend([1, 1]);
        }
        assert_eq!(*log.borrow(), expected);

        // A sample's outputs are all alive at its sync, and none after.
        assert!(alive_at_sync.borrow().contains(&MAX_CALLS_PER_SAMPLE));
        assert_eq!(*alive.borrow(), 0);
    }
}
