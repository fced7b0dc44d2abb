//! Measures one point on one backend: the sketched layer as the backend runs it (the fused
//! kernels on CubeCL backends), the same product through generic tensor operations, and
//! dense `Linear`; forward alone and forward + backward.

use burn::backend::Autodiff;
use burn::module::{Module, ModuleMapper, Param};
use burn::nn::LinearConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};
use burn_memory::DeviceMemory;
use burn_sketch::backend::{KernelStrategy, tensor_ops};
use burn_sketch::{SkLinearConfig, SketchBackend};
use serde::{Deserialize, Serialize};

use super::Dtype;
use super::grid::Point;
use super::memory::peak_increase;
use super::roofline::{DeviceSpec, Roofline};
use super::timing::{Op, Timing, op, time_together};

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

/// What to measure besides the point itself.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Untimed runs before timing.
    pub warmup: usize,
    /// Timed runs.
    pub runs: usize,
    /// The element type `B` computes in.
    pub dtype: Dtype,
    /// The device's datasheet peaks, for roofline bounds.
    pub device_spec: Option<DeviceSpec>,
    /// What "sketch" times on backends with a choice (CubeCL's).
    pub strategy: KernelStrategy,
}

/// Measures `point` on backend `B`; the training variants run on `Autodiff<B>`.
pub fn measure<B: SketchBackend + DeviceMemory>(
    point: Point,
    device: &B::Device,
    settings: Settings,
) -> Row {
    let Settings { warmup, runs, .. } = settings;
    let sync = || B::sync(device).expect("device sync failed");
    let config = SkLinearConfig::new(
        point.d_input,
        point.d_output,
        point.num_terms,
        point.low_rank,
    )
    .with_strategy(settings.strategy);
    let dense_config = LinearConfig::new(point.d_input, point.d_output);
    let dtype = settings.dtype.burn();
    let mut cast = CastParams(dtype);
    let sketch = config.init::<B>(device).map(&mut cast);
    let dense = dense_config.init::<B>(device).map(&mut cast);
    let x = Tensor::<B, 2>::random([point.batch, point.d_input], Distribution::Default, device)
        .cast(dtype);

    let bias = sketch.bias.as_ref().map(|b| b.val());
    // Forward and backward of `forward` on a fresh leaf input, all gradients computed.
    let x_ad = Tensor::<Autodiff<B>, 2>::from_inner(x.clone());
    let sketch_ad = config.init::<Autodiff<B>>(device).map(&mut cast);
    let dense_ad = dense_config.init::<Autodiff<B>>(device).map(&mut cast);
    let train = |forward: &dyn Fn(Tensor<Autodiff<B>, 2>) -> Tensor<Autodiff<B>, 2>| {
        forward(x_ad.clone().require_grad()).sum().backward()
    };
    let [
        sketch_forward,
        tensor_ops_forward,
        dense_forward,
        sketch_train,
        dense_train,
    ] = time_together(
        warmup,
        runs,
        [
            op(|| sketch.forward(x.clone())),
            op(|| tensor_ops::sketched_linear(x.clone(), sketch.weights(), bias.clone())),
            op(|| dense.forward(x.clone())),
            op(|| train(&|x| sketch_ad.forward(x))),
            op(|| train(&|x| dense_ad.forward(x))),
        ],
        sync,
    );

    // Each op once more, its output kept until the sync, as in its timed samples.
    let peak = |mut op: Op<'_>| {
        peak_increase::<B>(device, || {
            let output = op();
            sync();
            drop(output);
        })
    };
    let memory = PeakMemory {
        sketch_forward: peak(op(|| sketch.forward(x.clone()))),
        dense_forward: peak(op(|| dense.forward(x.clone()))),
        sketch_train: peak(op(|| train(&|x| sketch_ad.forward(x)))),
        dense_train: peak(op(|| train(&|x| dense_ad.forward(x)))),
    };

    let counts = sketch.param_counts();
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

/// Casts every float parameter to the measured element type, keeping each a leaf with its
/// `require_grad` flag. Backends whose element type is a type parameter (`Wgpu<f16>`) are
/// there already and this changes nothing; Flex picks the element type at run time, so its
/// layers are built in f32 and cast.
struct CastParams(DType);

impl<B: Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|tensor| {
            if tensor.dtype() == dtype {
                return tensor;
            }
            let tracked = tensor.is_require_grad();
            let cast = tensor.cast(dtype).detach();
            if tracked { cast.require_grad() } else { cast }
        })
    }
}
