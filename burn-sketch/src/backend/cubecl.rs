//! `SketchBackend` for every CubeCL backend (`Cuda`, `Wgpu`, ...): the kernels of
//! `burn-sketch-kernels`, forward and backward.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_sketch_kernels::{GradientsWanted, SketchFactors};

use super::{SketchBackend, SketchGradients, SketchWeights, WantedGradients};

fn factors<R, F, I, BT>(weights: SketchWeights<CubeBackend<R, F, I, BT>>) -> SketchFactors<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    SketchFactors {
        s1s: weights.s1s.into_primitive().tensor(),
        s2s: weights.s2s.into_primitive().tensor(),
        u1s: weights.u1s.into_primitive().tensor(),
        u2s: weights.u2s.into_primitive().tensor(),
    }
}

impl<R, F, I, BT> SketchBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
    Self: Backend<FloatTensorPrimitive = burn_cubecl::tensor::CubeTensor<R>>,
{
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Tensor<Self, 2> {
        let output = burn_sketch_kernels::forward(
            x.into_primitive().tensor(),
            &factors(weights),
            bias.map(|bias| bias.into_primitive().tensor()),
        );
        Tensor::from_primitive(TensorPrimitive::Float(output))
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
    ) -> SketchGradients<Self> {
        let wanted = GradientsWanted {
            x: wanted.x,
            s1s: wanted.s1s,
            s2s: wanted.s2s,
            u1s: wanted.u1s,
            u2s: wanted.u2s,
        };
        let grads = burn_sketch_kernels::backward(
            x.into_primitive().tensor(),
            &factors(weights),
            grad_output.into_primitive().tensor(),
            wanted,
        );
        let wrap2 = |t| Tensor::from_primitive(TensorPrimitive::Float(t));
        let wrap3 = |t| Tensor::from_primitive(TensorPrimitive::Float(t));
        SketchGradients {
            x: grads.x.map(wrap2),
            s1s: grads.s1s.map(wrap3),
            s2s: grads.s2s.map(wrap3),
            u1s: grads.u1s.map(wrap3),
            u2s: grads.u2s.map(wrap3),
        }
    }
}
