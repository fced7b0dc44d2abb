//! The five operations the bench runs at a point, built once per backend: timed on `B` by
//! `measure`, and run again on `Profiled<B>` by `profile` (`--profile`). One definition for
//! both, so that what is profiled is exactly what was timed.

use burn::backend::Autodiff;
use burn::module::{Module, ModuleMapper, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};
use burn_sketch::backend::KernelStrategy;
use burn_sketch::backend::tensor_ops;
use burn_sketch::{Activation, ActivationExt, SkLinear, SkLinearConfig, SketchBackend};

use super::Dtype;
use super::grid::Point;
use super::roofline::DeviceSpec;
use super::timing::{Op, op};

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
    /// The activation after every layer (`--activation`).
    pub activation: burn_sketch::Activation,
}

/// The workloads' names, in the order of [`Workloads::ops`]: the columns of a result row, and
/// the directories `--profile` writes.
pub const NAMES: [&str; 5] = [
    "sketch_forward",
    "tensor_ops_forward",
    "dense_forward",
    "sketch_train",
    "dense_train",
];

/// The layers and inputs of one point on backend `B`; the training workloads run on
/// `Autodiff<B>`.
pub struct Workloads<B: SketchBackend> {
    /// The sketched layer.
    pub sketch: SkLinear<B>,
    dense: Linear<B>,
    x: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    x_ad: Tensor<Autodiff<B>, 2>,
    sketch_ad: SkLinear<Autodiff<B>>,
    dense_ad: Linear<Autodiff<B>>,
    activation: Activation,
}

impl<B: SketchBackend> Workloads<B> {
    /// Draws the layers and the input of `point`, in the element type of `settings`.
    pub fn new(point: Point, device: &B::Device, settings: Settings) -> Self {
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
        let x_ad = Tensor::<Autodiff<B>, 2>::from_inner(x.clone());
        let sketch_ad = config.init::<Autodiff<B>>(device).map(&mut cast);
        let dense_ad = dense_config.init::<Autodiff<B>>(device).map(&mut cast);
        Self {
            sketch,
            dense,
            x,
            bias,
            x_ad,
            sketch_ad,
            dense_ad,
            activation: settings.activation,
        }
    }

    /// The workloads named in [`NAMES`], in that order: `SkLinear` forward as the backend
    /// runs it (the kernels on CubeCL backends), the same product through generic tensor
    /// operations, dense `Linear` forward, and forward + backward of each layer on a fresh
    /// leaf input, all gradients computed.
    ///
    /// With an activation (`--activation`), each layer is followed by it: the sketched layer
    /// applies it in its output pass, and the second workload becomes the unfused form of the
    /// first (the backend's own product, then Burn's activation as a pass of its own).
    pub fn ops(&self) -> [Op<'_>; 5] {
        let act = self.activation;
        let train = |forward: &dyn Fn(Tensor<Autodiff<B>, 2>) -> Tensor<Autodiff<B>, 2>| {
            forward(self.x_ad.clone().require_grad()).sum().backward()
        };
        [
            op(move || self.sketch.forward_activated(self.x.clone(), act)),
            op(move || match act {
                Activation::Identity => tensor_ops::sketched_linear(
                    self.x.clone(),
                    self.sketch.weights(),
                    self.bias.clone(),
                ),
                act => act.apply(self.sketch.forward(self.x.clone())),
            }),
            op(move || act.apply(self.dense.forward(self.x.clone()))),
            op(move || train(&|x| self.sketch_ad.forward_activated(x, act))),
            op(move || train(&|x| act.apply(self.dense_ad.forward(x)))),
        ]
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
