//! Measures one point on one backend: the sketched layer's tensor-op path and dense `Linear`,
//! forward alone and forward + backward.

use burn::backend::Autodiff;
use burn::nn::LinearConfig;
use burn::tensor::{Distribution, Tensor};
use burn_sketch::{SkLinearConfig, SketchBackend};
use serde::{Deserialize, Serialize};

use super::grid::Point;
use super::timing::{Timing, time};

/// Everything measured at one point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// The backend, as Burn names it.
    pub backend: String,
    /// The point.
    #[serde(flatten)]
    pub point: Point,
    /// Trainable parameters of the sketched layer (bias included).
    pub sketch_params: usize,
    /// Parameters of the dense layer (bias included).
    pub dense_params: usize,
    /// Sketched FLOPs over dense FLOPs.
    pub flop_ratio: f64,
    /// `SkLinear` forward, tensor-op path.
    pub sketch_forward: Timing,
    /// Dense `Linear` forward.
    pub dense_forward: Timing,
    /// `SkLinear` forward and backward (all gradients, input included), tensor-op path.
    pub sketch_train: Timing,
    /// Dense `Linear` forward and backward.
    pub dense_train: Timing,
}

impl Row {
    /// Dense time over sketched time, forward.
    pub fn forward_speedup(&self) -> f64 {
        self.dense_forward.median_ms / self.sketch_forward.median_ms
    }

    /// Dense time over sketched time, forward + backward.
    pub fn train_speedup(&self) -> f64 {
        self.dense_train.median_ms / self.sketch_train.median_ms
    }

    /// The speedup that the FLOP counts allow: `1 / flop_ratio`.
    pub fn possible_speedup(&self) -> f64 {
        1.0 / self.flop_ratio
    }
}

/// Measures `point` on backend `B`; the training variants run on `Autodiff<B>`.
pub fn measure<B: SketchBackend>(
    point: Point,
    device: &B::Device,
    warmup: usize,
    runs: usize,
) -> Row {
    let sync = || B::sync(device).expect("device sync failed");
    let config = SkLinearConfig::new(
        point.d_input,
        point.d_output,
        point.num_terms,
        point.low_rank,
    );
    let sketch = config.init::<B>(device);
    let dense = LinearConfig::new(point.d_input, point.d_output).init::<B>(device);
    let x = Tensor::<B, 2>::random([point.batch, point.d_input], Distribution::Default, device);

    let sketch_forward = time(warmup, runs, || drop(sketch.forward(x.clone())), sync);
    let dense_forward = time(warmup, runs, || drop(dense.forward(x.clone())), sync);

    type A<B> = Autodiff<B>;
    let sketch_ad = config.init::<A<B>>(device);
    let dense_ad = LinearConfig::new(point.d_input, point.d_output).init::<A<B>>(device);
    let x_ad = Tensor::<A<B>, 2>::from_inner(x);
    let sketch_train = time(
        warmup,
        runs,
        || {
            let y = sketch_ad.forward(x_ad.clone().require_grad());
            drop(y.sum().backward());
        },
        sync,
    );
    let dense_train = time(
        warmup,
        runs,
        || {
            let y = dense_ad.forward(x_ad.clone().require_grad());
            drop(y.sum().backward());
        },
        sync,
    );

    Row {
        backend: B::name(device),
        point,
        sketch_params: sketch.param_counts().trainable,
        dense_params: sketch.param_counts().dense,
        flop_ratio: point.flop_ratio(),
        sketch_forward,
        dense_forward,
        sketch_train,
        dense_train,
    }
}
