//! `SketchBackend` for `Fusion<B>`, the lazy wrapper that `Wgpu` and `Cuda` are by default.
//!
//! The product is registered in the fusion stream as one custom operation, so it is ordered
//! with the surrounding (possibly fused) operations without forcing them to run early; when
//! the stream executes it, the operation calls the inner backend's implementation (the CubeCL
//! kernels) on the resolved tensors.

use std::marker::PhantomData;

use burn::tensor::{Shape, Tensor};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{
    Activation, KernelStrategy, SketchBackend, SketchGradients, SketchWeights, WantedGradients,
    float,
};

impl<B> SketchBackend for Fusion<B>
where
    B: FusionBackend + SketchBackend,
{
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        let [rows, _] = x.dims();
        let (_, _, _, d_output) = weights.dims();
        let has_bias = bias.is_some();
        let mut inputs = operands(x, weights);
        inputs.extend(bias.map(|bias| bias.into_primitive().tensor()));
        let outputs = register::<B>(
            "burn_sketch::sketched_linear",
            inputs,
            vec![Shape::new([rows, d_output])],
            Step::Forward {
                has_bias,
                activation,
            },
            strategy,
        );
        float(outputs.into_iter().next().expect("one output"))
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
        strategy: KernelStrategy,
    ) -> SketchGradients<Self> {
        let mut inputs = operands(x, weights);
        // Each wanted gradient has its operand's shape; the outputs follow `OPERANDS` order.
        let shapes: Vec<Shape> = inputs
            .iter()
            .zip(wanted.to_array())
            .filter(|(_, wanted)| *wanted)
            .map(|(operand, _)| operand.shape.clone())
            .collect();
        inputs.push(grad_output.into_primitive().tensor());
        let outputs = register::<B>(
            "burn_sketch::sketched_linear_backward",
            inputs,
            shapes,
            Step::Backward { wanted },
            strategy,
        );
        SketchGradients::from_primitives(present(wanted, outputs))
    }
}

type Primitive<B> = FusionTensor<<B as FusionBackend>::FusionRuntime>;

/// `x` and the weights as primitives, in [`OPERANDS`](super::OPERANDS) order.
fn operands<B: FusionBackend>(
    x: Tensor<Fusion<B>, 2>,
    weights: SketchWeights<Fusion<B>>,
) -> Vec<Primitive<B>> {
    std::iter::once(x.into_primitive().tensor())
        .chain(weights.into_primitives())
        .collect()
}

/// Places `results`, one per wanted gradient in [`OPERANDS`](super::OPERANDS) order, at
/// their operands' positions.
fn present<T>(wanted: WantedGradients, results: impl IntoIterator<Item = T>) -> [Option<T>; 5] {
    let mut results = results.into_iter();
    wanted
        .to_array()
        .map(|is_wanted| is_wanted.then(|| results.next().expect("one result per wanted gradient")))
}

/// Registers a custom operation reading `inputs` and producing new tensors of `shapes`
/// (in the inputs' float type); returns them.
fn register<B: FusionBackend + SketchBackend>(
    name: &'static str,
    inputs: Vec<Primitive<B>>,
    shapes: Vec<Shape>,
    step: Step,
    strategy: KernelStrategy,
) -> Vec<Primitive<B>> {
    let client = inputs[0].client.clone();
    let dtype = inputs[0].dtype;
    let streams = OperationStreams::with_inputs(&inputs);
    let outputs: Vec<TensorIr> = shapes
        .into_iter()
        .map(|shape| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
        .collect();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|tensor| tensor.into_ir()).collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    client.register(
        streams,
        OperationIr::Custom(desc.clone()),
        SketchOp::<B> {
            desc,
            step,
            strategy,
            backend: PhantomData,
        },
    )
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Forward {
        has_bias: bool,
        activation: Activation,
    },
    Backward {
        wanted: WantedGradients,
    },
}

#[derive(Debug)]
struct SketchOp<B> {
    desc: CustomOpIr,
    step: Step,
    strategy: KernelStrategy,
    backend: PhantomData<fn() -> B>,
}

impl<B: FusionBackend + SketchBackend> Operation<B::FusionRuntime> for SketchOp<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let mut inputs = self
            .desc
            .inputs
            .iter()
            .map(|ir| handles.get_float_tensor::<B>(ir));
        let mut next = || inputs.next().expect("input registered with the operation");
        let x: Tensor<B, 2> = float(next());
        let weights = SketchWeights::from_primitives(std::array::from_fn(|_| next()));
        let results: Vec<B::FloatTensorPrimitive> = match self.step {
            Step::Forward {
                has_bias,
                activation,
            } => {
                let bias = has_bias.then(|| float(next()));
                let output = B::sketched_linear(x, weights, bias, activation, self.strategy);
                vec![output.into_primitive().tensor()]
            }
            Step::Backward { wanted } => {
                let grads =
                    B::sketched_linear_backward(x, weights, float(next()), wanted, self.strategy);
                // One output per wanted gradient, as registered.
                grads
                    .into_primitives()
                    .into_iter()
                    .zip(wanted.to_array())
                    .filter(|(_, wanted)| *wanted)
                    .map(|(grad, _)| grad.expect("a wanted gradient is computed"))
                    .collect()
            }
        };
        for (output, result) in self.desc.outputs.iter().zip(results) {
            handles.register_float_tensor::<B>(&output.id, result);
        }
    }
}
