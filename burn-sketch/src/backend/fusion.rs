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

use super::{SketchBackend, SketchGradients, SketchWeights, WantedGradients, float};

impl<B> SketchBackend for Fusion<B>
where
    B: FusionBackend + SketchBackend,
{
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Tensor<Self, 2> {
        let mut inputs = primitives(x, weights);
        let has_bias = bias.is_some();
        inputs.extend(bias.map(|bias| bias.into_primitive().tensor()));
        let [rows, _] = inputs[0].shape.dims::<2>();
        let d_output = inputs[2].shape.dims::<3>()[2];
        let outputs = register::<B>(
            "burn_sketch::sketched_linear",
            inputs,
            vec![Shape::new([rows, d_output])],
            Step::Forward { has_bias },
        );
        float(outputs.into_iter().next().expect("one output"))
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
    ) -> SketchGradients<Self> {
        let mut inputs = primitives(x, weights);
        inputs.push(grad_output.into_primitive().tensor());
        // Outputs in the order x, S1s, S2s, U1s, U2s, each only if wanted.
        let shapes: Vec<Shape> = [
            (wanted.x, &inputs[0]),
            (wanted.s1s, &inputs[1]),
            (wanted.s2s, &inputs[2]),
            (wanted.u1s, &inputs[3]),
            (wanted.u2s, &inputs[4]),
        ]
        .into_iter()
        .filter(|(wanted, _)| *wanted)
        .map(|(_, like)| like.shape.clone())
        .collect();
        let mut outputs = register::<B>(
            "burn_sketch::sketched_linear_backward",
            inputs,
            shapes,
            Step::Backward { wanted },
        )
        .into_iter();
        let mut next = |is_wanted: bool| is_wanted.then(|| outputs.next().expect("wanted output"));
        SketchGradients {
            x: next(wanted.x).map(float),
            s1s: next(wanted.s1s).map(float),
            s2s: next(wanted.s2s).map(float),
            u1s: next(wanted.u1s).map(float),
            u2s: next(wanted.u2s).map(float),
        }
    }
}

type Primitive<B> = FusionTensor<<B as FusionBackend>::FusionRuntime>;

fn primitives<B: FusionBackend>(
    x: Tensor<Fusion<B>, 2>,
    weights: SketchWeights<Fusion<B>>,
) -> Vec<Primitive<B>> {
    vec![
        x.into_primitive().tensor(),
        weights.s1s.into_primitive().tensor(),
        weights.s2s.into_primitive().tensor(),
        weights.u1s.into_primitive().tensor(),
        weights.u2s.into_primitive().tensor(),
    ]
}

/// Registers a custom operation reading `inputs` and producing new tensors of `shapes`
/// (in the inputs' float type); returns them.
fn register<B: FusionBackend + SketchBackend>(
    name: &'static str,
    inputs: Vec<Primitive<B>>,
    shapes: Vec<Shape>,
    step: Step,
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
            backend: PhantomData,
        },
    )
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Forward { has_bias: bool },
    Backward { wanted: WantedGradients },
}

#[derive(Debug)]
struct SketchOp<B> {
    desc: CustomOpIr,
    step: Step,
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
        let weights = SketchWeights {
            s1s: float(next()),
            s2s: float(next()),
            u1s: float(next()),
            u2s: float(next()),
        };
        let results: Vec<B::FloatTensorPrimitive> = match self.step {
            Step::Forward { has_bias } => {
                let bias = has_bias.then(|| float(next()));
                vec![
                    B::sketched_linear(x, weights, bias)
                        .into_primitive()
                        .tensor(),
                ]
            }
            Step::Backward { wanted } => {
                let grads = B::sketched_linear_backward(x, weights, float(next()), wanted);
                let matrices = grads.x.map(|g| g.into_primitive().tensor());
                let factors = [grads.s1s, grads.s2s, grads.u1s, grads.u2s]
                    .into_iter()
                    .flatten()
                    .map(|g| g.into_primitive().tensor());
                matrices.into_iter().chain(factors).collect()
            }
        };
        for (output, result) in self.desc.outputs.iter().zip(results) {
            handles.register_float_tensor::<B>(&output.id, result);
        }
    }
}
