//! Measures one point on one backend: the sketched layer as the backend runs it (the fused
//! kernels on CubeCL backends), the same product through generic tensor operations, and
//! dense `Linear`; forward alone and forward + backward.

use burn_memory::DeviceMemory;
use burn_sketch::SketchBackend;
use serde::{Deserialize, Serialize};

use super::Dtype;
use super::grid::Point;
use super::memory::peak_increase;
use super::roofline::Roofline;
use super::timing::{Op, Timing, time_together};
use super::workloads::{Settings, Workloads};

/// Everything measured at one point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// The backend, as Burn names it.
    pub backend: String,
    /// The element type of inputs, weights and outputs.
    pub dtype: Dtype,
    /// The point.
    #[serde(flatten)]
    pub point: Point,
    /// Trainable parameters of the sketched layer (bias included).
    pub sketch_params: usize,
    /// Parameters of the dense layer (bias included).
    pub dense_params: usize,
    /// Sketched FLOPs over dense FLOPs.
    pub flop_ratio: f64,
    /// The least memory traffic of the sketched forward: bytes of `x`, the four factors, the
    /// bias and `y`, each moved once. Over the device bandwidth, a lower bound on its time.
    pub forward_bytes: usize,
    /// `SkLinear` forward, as the backend runs it (kernels on CubeCL backends).
    pub sketch_forward: Timing,
    /// The same product through `burn_sketch::backend::tensor_ops` on the same backend.
    pub tensor_ops_forward: Timing,
    /// Dense `Linear` forward.
    pub dense_forward: Timing,
    /// `SkLinear` forward and backward (all gradients, input included), as the backend runs it.
    pub sketch_train: Timing,
    /// Dense `Linear` forward and backward.
    pub dense_train: Timing,
    /// Peak memory of the forward passes and the training steps above.
    pub memory: PeakMemory,
    /// Least times on the device named with `--device-model`, if one was.
    pub roofline: Option<Roofline>,
}

/// How far each operation raised the device's memory peak, in bytes (see `memory.rs`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct PeakMemory {
    /// `SkLinear` forward.
    pub sketch_forward: u64,
    /// Dense `Linear` forward.
    pub dense_forward: u64,
    /// `SkLinear` forward and backward.
    pub sketch_train: u64,
    /// Dense `Linear` forward and backward.
    pub dense_train: u64,
}

impl Row {
    /// Dense time over sketched time, forward.
    pub fn forward_speedup(&self) -> f64 {
        self.dense_forward.median_ms / self.sketch_forward.median_ms
    }

    /// Tensor-op time over the backend's own time, forward: what the kernels gain.
    pub fn kernel_speedup(&self) -> f64 {
        self.tensor_ops_forward.median_ms / self.sketch_forward.median_ms
    }

    /// Dense time over sketched time, forward + backward.
    pub fn train_speedup(&self) -> f64 {
        self.dense_train.median_ms / self.sketch_train.median_ms
    }

    /// The forward speedup possible: the ratio of the roofline bounds on a known device,
    /// otherwise the FLOP counts' `1 / flop_ratio`.
    pub fn possible_speedup(&self) -> f64 {
        self.roofline
            .as_ref()
            .map_or(1.0 / self.flop_ratio, Roofline::possible_speedup)
    }

    /// The sketched forward's roofline bound over its measured time, on a known device.
    pub fn roofline_efficiency(&self) -> Option<f64> {
        let roof = self.roofline.as_ref()?;
        Some(roof.sketch_forward_ms / self.sketch_forward.median_ms)
    }
}

/// Measures `point` on backend `B`; the training variants run on `Autodiff<B>`.
pub fn measure<B: SketchBackend + DeviceMemory>(
    point: Point,
    device: &B::Device,
    settings: Settings,
) -> Row {
    let Settings { warmup, runs, .. } = settings;
    let sync = || B::sync(device).expect("device sync failed");
    let workloads = Workloads::<B>::new(point, device, settings);
    let [
        sketch_forward,
        tensor_ops_forward,
        dense_forward,
        sketch_train,
        dense_train,
    ] = time_together(warmup, runs, workloads.ops(), sync);

    // Each op once more, its output kept until the sync, as in its timed samples.
    let peak = |mut op: Op<'_>| {
        peak_increase::<B>(device, || {
            let output = op();
            sync();
            drop(output);
        })
    };
    let [sketch_fwd, _, dense_fwd, sketch_trn, dense_trn] = workloads.ops();
    let memory = PeakMemory {
        sketch_forward: peak(sketch_fwd),
        dense_forward: peak(dense_fwd),
        sketch_train: peak(sketch_trn),
        dense_train: peak(dense_trn),
    };

    let counts = workloads.sketch.param_counts();
    Row {
        backend: B::name(device),
        dtype: settings.dtype,
        point,
        sketch_params: counts.trainable,
        dense_params: counts.dense,
        flop_ratio: point.flop_ratio(),
        forward_bytes: point.sketch_forward_elements() * settings.dtype.size(),
        sketch_forward,
        tensor_ops_forward,
        dense_forward,
        sketch_train,
        dense_train,
        memory,
        roofline: settings
            .device_spec
            .map(|spec| Roofline::new(point, settings.dtype, spec)),
    }
}
