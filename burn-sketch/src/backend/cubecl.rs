//! `SketchBackend` for every CubeCL backend (`Cuda`, `Wgpu`, ...): the kernels of
//! `burn-sketch-kernels` forward and backward, or the tensor-op path where the
//! [autotuner](super::policy) finds it faster.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_sketch_kernels::{GradientsWanted, SketchFactors};

use super::policy::{TuneKey, use_kernels};
use super::{SketchBackend, SketchGradients, SketchWeights, WantedGradients, float, tensor_ops};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

fn factors<R, F, I, BT>(weights: SketchWeights<Cube<R, F, I, BT>>) -> SketchFactors<R>
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

fn tune_key<B: Backend>(
    x: &Tensor<B, 2>,
    weights: &SketchWeights<B>,
    backward: bool,
    bias: bool,
) -> TuneKey {
    let [rows, d_input] = x.dims();
    let [terms, _, rank] = weights.s1s.dims();
    TuneKey {
        device: format!("{:?}", x.device()),
        backward,
        dtype: format!("{:?}", x.dtype()),
        rows: rows.next_power_of_two(),
        dims: [d_input, weights.s2s.dims()[2], terms, rank],
        bias,
    }
}

fn kernel_forward<R, F, I, BT>(
    x: Tensor<Cube<R, F, I, BT>, 2>,
    weights: SketchWeights<Cube<R, F, I, BT>>,
    bias: Option<Tensor<Cube<R, F, I, BT>, 1>>,
) -> Tensor<Cube<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let output = burn_sketch_kernels::forward(
        x.into_primitive().tensor(),
        &factors(weights),
        bias.map(|bias| bias.into_primitive().tensor()),
    );
    float(output)
}

fn kernel_backward<R, F, I, BT>(
    x: Tensor<Cube<R, F, I, BT>, 2>,
    weights: SketchWeights<Cube<R, F, I, BT>>,
    grad_output: Tensor<Cube<R, F, I, BT>, 2>,
    wanted: WantedGradients,
) -> SketchGradients<Cube<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
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
    SketchGradients {
        x: grads.x.map(float),
        s1s: grads.s1s.map(float),
        s2s: grads.s2s.map(float),
        u1s: grads.u1s.map(float),
        u2s: grads.u2s.map(float),
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
        let device = x.device();
        let kernels = use_kernels(
            || tune_key(&x, &weights, false, bias.is_some()),
            || drop(kernel_forward(x.clone(), weights.clone(), bias.clone())),
            || {
                drop(tensor_ops::sketched_linear(
                    x.clone(),
                    weights.clone(),
                    bias.clone(),
                ))
            },
            || Self::sync(&device).expect("device sync"),
        );
        if kernels {
            kernel_forward(x, weights, bias)
        } else {
            tensor_ops::sketched_linear(x, weights, bias)
        }
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
    ) -> SketchGradients<Self> {
        let device = x.device();
        let kernels = use_kernels(
            || tune_key(&x, &weights, true, false),
            || {
                drop(kernel_backward(
                    x.clone(),
                    weights.clone(),
                    grad_output.clone(),
                    wanted,
                ))
            },
            || {
                drop(tensor_ops::sketched_linear_backward(
                    x.clone(),
                    weights.clone(),
                    grad_output.clone(),
                    wanted,
                ))
            },
            || Self::sync(&device).expect("device sync"),
        );
        if kernels {
            kernel_backward(x, weights, grad_output, wanted)
        } else {
            tensor_ops::sketched_linear_backward(x, weights, grad_output, wanted)
        }
    }
}
