//! Whether CubeCL backends run the sketch kernels or the tensor-op path, and the autotuner
//! that decides it per shape in the default mode.
//!
//! Why autotune: the kernels' speed against Burn's own tuned matmuls depends on the device
//! and the shape (on a GPU the fused forward saves a round trip of `P` and a launch; on a
//! CPU Vulkan driver such as lavapipe the matmul kernels of CubeCL are far faster). Timing
//! both once per shape class and remembering the winner means `SkLinear` is never slower
//! than the generic path on any device, without a tuning table that could only be right for
//! the GPUs it was measured on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Which implementation CubeCL backends use for the sketched product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPolicy {
    /// Time both on first use of each shape class, then use the faster (the default).
    Autotune,
    /// Always the `burn-sketch-kernels` kernels.
    Kernels,
    /// Always the tensor-op path.
    TensorOps,
}

static POLICY: AtomicU8 = AtomicU8::new(0);

/// Sets the policy for the whole process (tests and benchmarks pin one side this way).
pub fn set_kernel_policy(policy: KernelPolicy) {
    let value = match policy {
        KernelPolicy::Autotune => 0,
        KernelPolicy::Kernels => 1,
        KernelPolicy::TensorOps => 2,
    };
    POLICY.store(value, Ordering::Relaxed);
}

/// The policy in force.
pub fn kernel_policy() -> KernelPolicy {
    match POLICY.load(Ordering::Relaxed) {
        1 => KernelPolicy::Kernels,
        2 => KernelPolicy::TensorOps,
        _ => KernelPolicy::Autotune,
    }
}

/// What the autotuner remembers a decision by: the device, the direction, the element type
/// and the shape, with the row count rounded up to a power of two (batch sizes vary; the
/// layer's dimensions do not).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TuneKey {
    pub device: String,
    pub backward: bool,
    pub dtype: String,
    pub rows: usize,
    pub dims: [usize; 4],
    pub bias: bool,
}

fn decisions() -> &'static Mutex<HashMap<TuneKey, bool>> {
    static DECISIONS: OnceLock<Mutex<HashMap<TuneKey, bool>>> = OnceLock::new();
    DECISIONS.get_or_init(Default::default)
}

/// Whether to use the kernels for the shape `key` describes: decided by the policy, or under
/// [`KernelPolicy::Autotune`] (the only case that builds the key) by timing `kernels` against `tensor_ops` (each run once to
/// compile and warm up, then three times; `sync` waits for the device) on first use.
pub(crate) fn use_kernels(
    key: impl FnOnce() -> TuneKey,
    kernels: impl Fn(),
    tensor_ops: impl Fn(),
    sync: impl Fn(),
) -> bool {
    match kernel_policy() {
        KernelPolicy::Kernels => return true,
        KernelPolicy::TensorOps => return false,
        KernelPolicy::Autotune => {}
    }
    let key = key();
    if let Some(&choice) = decisions().lock().expect("tuner lock").get(&key) {
        return choice;
    }
    let time = |run: &dyn Fn()| -> Duration {
        run();
        sync();
        let mut samples: Vec<Duration> = (0..3)
            .map(|_| {
                let start = Instant::now();
                run();
                sync();
                start.elapsed()
            })
            .collect();
        samples.sort();
        samples[1]
    };
    let kernel_time = time(&kernels);
    let tensor_ops_time = time(&tensor_ops);
    let choice = kernel_time < tensor_ops_time;
    tracing::debug!(
        ?key,
        ?kernel_time,
        ?tensor_ops_time,
        "burn-sketch autotune: {}",
        if choice { "kernels" } else { "tensor ops" }
    );
    decisions().lock().expect("tuner lock").insert(key, choice);
    choice
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn key(rows: usize) -> TuneKey {
        TuneKey {
            device: "test".into(),
            backward: false,
            dtype: "F32".into(),
            rows,
            dims: [1, 2, 3, 4],
            bias: false,
        }
    }

    #[test]
    fn autotune_picks_the_faster_once_and_the_policy_overrides_it() {
        let runs = Cell::new(0);
        let slow = || std::thread::sleep(Duration::from_millis(3));
        let fast = || runs.set(runs.get() + 1);
        assert!(use_kernels(|| key(8), fast, slow, || ()));
        assert_eq!(runs.get(), 4, "one warm-up and three timed runs");
        // Remembered: nothing is timed again.
        assert!(use_kernels(|| key(8), fast, slow, || ()));
        assert_eq!(runs.get(), 4);
        // Another shape class is tuned on its own.
        assert!(!use_kernels(|| key(16), slow, fast, || ()));

        set_kernel_policy(KernelPolicy::TensorOps);
        assert!(!use_kernels(|| key(8), fast, slow, || ()));
        set_kernel_policy(KernelPolicy::Kernels);
        assert!(use_kernels(|| key(16), slow, fast, || ()));
        set_kernel_policy(KernelPolicy::Autotune);
        assert_eq!(kernel_policy(), KernelPolicy::Autotune);
    }
}
