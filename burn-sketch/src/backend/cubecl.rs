//! `SketchBackend` for every CubeCL backend (`Cuda`, `Wgpu`, ...): the kernels of
//! `burn-sketch-kernels` forward and backward, or the tensor-op path, as the call's
//! [`KernelStrategy`] says; under [`KernelStrategy::Autotune`] CubeCL's autotuner times both
//! once per shape class and device and remembers the faster.

use burn::tensor::{DType, Tensor};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::AutotuneKey;
use burn_cubecl::cubecl::tune::{LocalTuner, Tunable, TunableSet, local_tuner};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, CubeTuneId, FloatElement, IntElement};
use burn_sketch_kernels as kernels;
use serde::{Deserialize, Serialize};

use super::{
    Activation, ActivationExt, KernelStrategy, SketchBackend, SketchGradients, SketchWeights,
    WantedGradients, float, tensor_ops,
};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// What a tuning decision is remembered by, per device: the element type and the layer's
/// sizes, with the row count anchored to powers of two (batch sizes vary; layers do not).
/// `wanted` is the backward's gradient set (`[false; 5]` for the forward), `bias` and
/// `activation` the forward's.
#[derive(Hash, Eq, PartialEq, Debug, Clone, Serialize, Deserialize, AutotuneKey)]
struct SketchAutotuneKey {
    dtype: DType,
    #[autotune(anchor)]
    rows: usize,
    d_input: usize,
    d_output: usize,
    num_terms: usize,
    low_rank: usize,
    bias: bool,
    activation: Activation,
    wanted: [bool; 5],
}

impl SketchAutotuneKey {
    fn of<R: CubeRuntime>(x: &CubeTensor<R>, weights: &kernels::CubeWeights<R>) -> Self {
        let [num_terms, d_input, low_rank] = weights.s1s.meta.shape().dims::<3>();
        Self::new(
            x.dtype,
            x.meta.shape().dims::<2>()[0],
            d_input,
            weights.s2s.meta.shape().dims::<3>()[2],
            num_terms,
            low_rank,
            false,
            Activation::Identity,
            [false; 5],
        )
    }
}

type ForwardInputs<R> = (
    CubeTensor<R>,
    kernels::CubeWeights<R>,
    Option<CubeTensor<R>>,
    Activation,
);
type BackwardInputs<R> = (
    CubeTensor<R>,
    kernels::CubeWeights<R>,
    CubeTensor<R>,
    WantedGradients,
);

fn autotuned_forward<R, F, I, BT>(inputs: ForwardInputs<R>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    static TUNER: LocalTuner<SketchAutotuneKey, CubeTuneId> = local_tuner!("forward");
    let tunables = TUNER.init(|| {
        let key = |(x, weights, bias, activation): &ForwardInputs<R>| SketchAutotuneKey {
            bias: bias.is_some(),
            activation: *activation,
            ..SketchAutotuneKey::of(x, weights)
        };
        TunableSet::<_, ForwardInputs<R>, _>::new_cloning_inputs(key)
            .with(Tunable::new(
                "sketch_kernels",
                |(x, weights, bias, activation): ForwardInputs<R>| {
                    kernels::forward(x, &weights, bias, activation).map_err(|err| err.to_string())
                },
            ))
            .with(Tunable::new(
                "tensor_ops",
                |(x, weights, bias, activation): ForwardInputs<R>| {
                    let weights =
                        SketchWeights::<Cube<R, F, I, BT>>::from_primitives(cube_array(weights));
                    let output = tensor_ops::sketched_linear(float(x), weights, bias.map(float));
                    Ok::<_, String>(activation.apply(output).into_primitive().tensor())
                },
            ))
    });
    let (client, device) = (inputs.0.client.clone(), inputs.0.device.clone());
    TUNER.execute(
        &CubeTuneId::new(&client, &device),
        &client,
        tunables,
        inputs,
    )
}

fn autotuned_backward<R, F, I, BT>(inputs: BackwardInputs<R>) -> SketchGradients<Cube<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    static TUNER: LocalTuner<SketchAutotuneKey, CubeTuneId> = local_tuner!("backward");
    let tunables = TUNER.init(|| {
        let key = |(x, weights, _, wanted): &BackwardInputs<R>| SketchAutotuneKey {
            wanted: wanted.to_array(),
            ..SketchAutotuneKey::of(x, weights)
        };
        TunableSet::<_, BackwardInputs<R>, _>::new_cloning_inputs(key)
            .with(Tunable::new(
                "sketch_kernels",
                |inputs: BackwardInputs<R>| kernel_gradients(inputs).map_err(|err| err.to_string()),
            ))
            .with(Tunable::new(
                "tensor_ops",
                |(x, weights, grad_output, wanted): BackwardInputs<R>| {
                    let weights =
                        SketchWeights::<Cube<R, F, I, BT>>::from_primitives(cube_array(weights));
                    let grads = tensor_ops::sketched_linear_backward(
                        float(x),
                        weights,
                        float(grad_output),
                        wanted,
                    );
                    Ok::<_, String>(Gradients(grads.into_primitives()))
                },
            ))
    });
    let (client, device) = (inputs.0.client.clone(), inputs.0.device.clone());
    let Gradients(grads) = TUNER.execute(
        &CubeTuneId::new(&client, &device),
        &client,
        tunables,
        inputs,
    );
    SketchGradients::from_primitives(grads)
}

/// The backward's gradients in [`OPERANDS`](super::OPERANDS) order, as the tuner's output.
struct Gradients<R: CubeRuntime>([Option<CubeTensor<R>>; 5]);

impl<R: CubeRuntime> cubecl::tune::AutotuneOutput for Gradients<R> {}

fn cube_array<R: CubeRuntime>(weights: kernels::CubeWeights<R>) -> [CubeTensor<R>; 4] {
    [weights.s1s, weights.s2s, weights.u1s, weights.u2s]
}

fn kernel_weights<R, F, I, BT>(weights: SketchWeights<Cube<R, F, I, BT>>) -> kernels::CubeWeights<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [s1s, s2s, u1s, u2s] = weights.into_primitives();
    kernels::CubeWeights { s1s, s2s, u1s, u2s }
}

fn kernel_gradients<R: CubeRuntime>(
    (x, weights, grad_output, wanted): BackwardInputs<R>,
) -> Result<Gradients<R>, kernels::KernelError> {
    let wanted = kernels::Operands {
        x: wanted.x,
        s1s: wanted.s1s,
        s2s: wanted.s2s,
        u1s: wanted.u1s,
        u2s: wanted.u2s,
    };
    let grads = kernels::backward(x, &weights, grad_output, wanted)?;
    Ok(Gradients([
        grads.x, grads.s1s, grads.s2s, grads.u1s, grads.u2s,
    ]))
}

/// The kernels refuse only operands that do not fit together, which `SketchBackend`'s
/// callers rule out (`SkLinear` checks its input's width); a refusal here is a bug.
fn expect_fits<T>(result: Result<T, kernels::KernelError>) -> T {
    result.unwrap_or_else(|err| {
        panic!("burn-sketch: the sketch kernels refused their operands: {err}")
    })
}

impl<R, F, I, BT> SketchBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        if strategy == KernelStrategy::TensorOps {
            return activation.apply(tensor_ops::sketched_linear(x, weights, bias));
        }
        let inputs = (
            x.into_primitive().tensor(),
            kernel_weights(weights),
            bias.map(|bias| bias.into_primitive().tensor()),
            activation,
        );
        float(match strategy {
            KernelStrategy::Kernels => {
                let (x, weights, bias, activation) = inputs;
                expect_fits(kernels::forward(x, &weights, bias, activation))
            }
            _ => autotuned_forward::<R, F, I, BT>(inputs),
        })
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
        strategy: KernelStrategy,
    ) -> SketchGradients<Self> {
        if strategy == KernelStrategy::TensorOps {
            return tensor_ops::sketched_linear_backward(x, weights, grad_output, wanted);
        }
        let inputs = (
            x.into_primitive().tensor(),
            kernel_weights(weights),
            grad_output.into_primitive().tensor(),
            wanted,
        );
        match strategy {
            KernelStrategy::Kernels => {
                let Gradients(grads) = expect_fits(kernel_gradients(inputs));
                SketchGradients::from_primitives(grads)
            }
            _ => autotuned_backward::<R, F, I, BT>(inputs),
        }
    }
}
