//! The memory tools on `Wgpu` (Mesa's lavapipe in CI): one test binary so the wgpu device and
//! its kernels are set up once.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Wgpu};
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData, Tolerance};
use burn_memory::{
    Checkpointing, MemoryMonitor, MemoryTracker, Precision, WithAutodiff, chunked_forward,
};

type W = Wgpu;

fn device() -> burn::tensor::Device<W> {
    Default::default()
}

/// The figures are the whole device's, so tests that allocate on the default wgpu device must
/// not overlap: each holds this lock for its duration, the other modules' wgpu tests included.
static DEVICE: Mutex<()> = Mutex::new(());

pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    DEVICE.lock().unwrap_or_else(|poison| poison.into_inner())
}

#[test]
fn tracker_sees_allocations_and_transient_peaks() {
    let _device = exclusive();
    let device = device();
    let tracker = MemoryTracker::<W>::new(&device);
    let before = tracker.usage().unwrap();

    // 16 MiB of f32 that stays alive.
    const BYTES: u64 = 4 * 1024 * 1024 * 4;
    let kept = Tensor::<W, 2>::random([1024, 4096], Distribution::Default, &device);
    let during = tracker.usage().unwrap();
    assert!(
        during.in_use >= before.in_use + BYTES,
        "in use {} -> {} after a {BYTES}-byte tensor",
        before.in_use,
        during.in_use
    );
    assert!(during.reserved >= during.in_use);

    // A 64 MiB tensor that lives only inside the closure: the peak must show it, the final
    // usage must not.
    const TRANSIENT: u64 = 4096 * 4096 * 4;
    let (sum, report) = tracker
        .profile(|| {
            let big = Tensor::<W, 2>::ones([4096, 4096], &device);
            big.sum().into_scalar()
        })
        .unwrap();
    assert_eq!(sum, 4096.0 * 4096.0);
    assert!(
        report.peak >= report.before.in_use + TRANSIENT,
        "peak {} does not show the 64 MiB transient (before {})",
        report.peak,
        report.before.in_use
    );
    assert!(
        report.after.in_use < report.before.in_use + TRANSIENT / 2,
        "the transient is still counted in use after the closure: {report}"
    );

    // A reset forgets the old peak.
    tracker.reset_peak().unwrap();
    let peak = tracker.peak().unwrap();
    assert!(
        peak < report.peak,
        "peak after reset {peak} >= {}",
        report.peak
    );
    drop(kept);
}

/// A deep MLP whose blocks are a linear layer and a few element-wise operations (SiLU and a
/// residual), the memory-bound activations checkpointing recomputes.
#[derive(Module, Debug)]
struct DeepMlp<B: Backend> {
    layers: Vec<Linear<B>>,
}

impl<B: Backend> DeepMlp<B> {
    /// Deterministic weights (not the shared RNG, which tests running in parallel also draw
    /// from), so that both strategies train the same network.
    fn new(width: usize, depth: usize, device: &B::Device) -> Self {
        let values = |n: usize, salt: usize| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    (((i * 31 + salt * 17) % 101) as f32 - 50.0) / (50.0 * width as f32).sqrt()
                })
                .collect()
        };
        Self {
            layers: (0..depth)
                .map(|l| Linear {
                    weight: Param::from_tensor(Tensor::from_data(
                        TensorData::new(values(width * width, l), [width, width]),
                        device,
                    )),
                    bias: Some(Param::from_tensor(Tensor::from_data(
                        TensorData::new(values(width, l + 100), [width]),
                        device,
                    ))),
                })
                .collect(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for layer in &self.layers {
            let h = layer.forward(x.clone());
            let silu = h.clone() * burn::tensor::activation::sigmoid(h);
            x = x + silu.mul_scalar(0.5);
        }
        x
    }
}

/// Measured peak of the backward pass of the deep MLP under a checkpointing strategy, and the
/// gradients of the first and last layers' weights.
struct BackwardPeak;

const BATCH: usize = 1024;

impl WithAutodiff<W> for BackwardPeak {
    type Output = (u64, u64, Vec<TensorData>);

    fn run<C: CheckpointStrategy>(self) -> Self::Output {
        type A<C> = Autodiff<W, C>;
        let device = device();
        let model = DeepMlp::<A<C>>::new(512, 12, &device);
        let x = Tensor::<A<C>, 2>::from_data(
            TensorData::new(
                (0..BATCH * 512)
                    .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
                    .collect(),
                [BATCH, 512],
            ),
            &device,
        );
        let tracker = MemoryTracker::<A<C>>::new(&device);
        let loss = model.forward(x).powi_scalar(2).mean();
        // The forward has run and the graph holds what backward will need.
        tracker.reset_peak().unwrap();
        let held = tracker.usage().unwrap().in_use;
        // The pools' reserved pages are too coarse (and too fragmented) to tell the two apart,
        // so the peak here is the in-use figure sampled every millisecond during backward.
        let monitor = MemoryMonitor::start(tracker.clone(), Duration::from_millis(1));
        let grads = loss.backward();
        tracker.usage().unwrap();
        let timeline = monitor.stop();
        assert!(timeline.samples.len() > 10, "{}", timeline.summary());
        // The monitor's thread reads this thread's stream: its samples see the activations.
        assert!(
            timeline.stats().unwrap().max >= held / 2,
            "{}",
            timeline.summary()
        );
        let peak = tracker.peak_in_use_sampled();
        let first = model.layers[0].weight.grad(&grads).unwrap().into_data();
        let last = model.layers[11].weight.grad(&grads).unwrap().into_data();
        (held, peak, vec![first, last])
    }
}

#[test]
fn checkpointing_lowers_the_backward_peak_with_identical_gradients() {
    let _device = exclusive();
    let (held_none, peak_none, grads_none) = Checkpointing::None.run::<W, _>(BackwardPeak);
    let (held_balanced, peak_balanced, grads_balanced) =
        Checkpointing::Balanced.run::<W, _>(BackwardPeak);
    eprintln!(
        "deep MLP 12×512, batch {BATCH}: held after forward {held_none} vs {held_balanced}, \
         backward peak {peak_none} vs {peak_balanced} (none vs balanced)"
    );
    assert!(
        held_balanced < held_none,
        "balanced checkpointing holds {held_balanced} after forward, not below {held_none}"
    );
    assert!(
        peak_balanced < peak_none,
        "balanced checkpointing peak {peak_balanced} is not below {peak_none}"
    );
    for (a, b) in grads_none.iter().zip(&grads_balanced) {
        a.assert_approx_eq::<f32>(b, Tolerance::absolute(1e-6));
    }
}

#[test]
fn f16_mixed_precision_training_reduces_the_loss() {
    let _device = exclusive();
    crate::mixed_precision::training_reduces_the_loss::<Autodiff<W>>(&device(), Precision::F16);
}

#[test]
fn chunked_inference_equals_one_pass_on_wgpu() {
    let _device = exclusive();
    let device = device();
    let layer = LinearConfig::new(64, 48).init::<W>(&device);
    let x = Tensor::<W, 2>::random([1000, 64], Distribution::Default, &device);
    let whole = layer.forward(x.clone()).into_data();
    let chunked = chunked_forward(x, 96, |c| layer.forward(c))
        .unwrap()
        .into_data();
    whole.assert_approx_eq::<f32>(&chunked, Tolerance::absolute(1e-6));
}

/// On CubeCL's pool bytes: a budget of what the pools hold after cleanup (nothing, here) plus
/// 128 MiB. The peak is the pools' reserved bytes, rounded up to their pages and not monotonic
/// in the batch size (measured on lavapipe: batch 4 peaks at 40 MiB, batch 8 at 16 MiB; 17-24
/// at 136 MiB, 32 at 72 MiB), hence the wide range (the step needs 1-3 MiB per sample).
#[test]
fn batch_size_search_respects_the_budget_on_wgpu() {
    let _device = exclusive();
    crate::batch_search::search_respects_the_budget::<W>(&device(), 128 << 20, 8..=128);
}

/// The adapter probe finds lavapipe (or a GPU) here.
#[test]
fn wgpu_adapter_is_found_here() {
    let adapter = burn_memory::wgpu_adapter().unwrap();
    assert!(!adapter.is_empty());
}

/// Without any Vulkan driver (the loader pointed at a driver list that does not exist, in a
/// process of its own), the probe returns `NoDevice` with what to install, instead of
/// CubeCL's panic on its device thread.
#[test]
fn without_a_driver_the_wgpu_probe_names_what_to_install() {
    crate::own_process::in_own_process(
        "wgpu::without_a_driver_the_wgpu_probe_names_what_to_install",
        || {
            // SAFETY: the child runs this test alone, before anything reads the environment.
            unsafe {
                std::env::set_var("VK_ICD_FILENAMES", "/nonexistent/icd.json");
                std::env::set_var("VK_DRIVER_FILES", "/nonexistent/icd.json");
            }
            match burn_memory::wgpu_adapter() {
                Err(err @ burn_memory::MemoryError::NoDevice { .. }) => {
                    let message = err.to_string();
                    assert!(message.contains("mesa-vulkan-drivers"), "{message}");
                }
                other => panic!("expected NoDevice without a driver, got {other:?}"),
            }
        },
    );
}

/// Segment checkpointing's gradients on wgpu equal the plain backward's there.
#[test]
fn segmented_gradients_match_the_plain_backward() {
    let _device = exclusive();
    crate::segments::gradients_match_the_plain_backward::<Autodiff<W>>(&device());
}

#[test]
fn batch_norm_segments_match_the_plain_backward() {
    let _device = exclusive();
    crate::segments::batch_norm_gradients_match_the_plain_backward::<Autodiff<W>>(&device());
}

#[test]
fn segments_update_running_statistics_once() {
    let _device = exclusive();
    crate::segments::running_statistics_are_updated_once::<Autodiff<W>>(&device());
}

/// CubeCL's generator is the whole process's, but only wgpu tests draw from it, and they hold
/// the device lock.
#[test]
fn segments_reproduce_dropout_masks() {
    let _device = exclusive();
    crate::segments::dropout_masks_are_reproduced::<Autodiff<W>>(&device());
}

#[test]
fn tuple_state_segments_match_the_plain_backward() {
    let _device = exclusive();
    crate::segments::tuple_state_gradients_match_the_plain_backward::<Autodiff<W>>(&device());
}

#[test]
fn f16_segments_match_the_f16_plain_backward() {
    let _device = exclusive();
    crate::segments::half_precision_segments_match_the_plain_backward::<Autodiff<W>>(
        &device(),
        Precision::F16,
    );
}

#[test]
fn offloaded_tiers_match_the_resident_model() {
    let _device = exclusive();
    crate::offload::every_tier_matches_the_resident_model::<W>(&device());
}

#[test]
fn offload_cleanup_returns_device_memory_to_its_level_before_wrapping() {
    let _device = exclusive();
    // CubeCL's in-use figure is exact: nothing may be left.
    crate::offload::cleanup_returns_memory::<W>(&device(), 0);
}
