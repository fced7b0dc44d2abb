//! `SketchBackend` for burn-profiler's `Profiled<B>`: the sketched product and its backward
//! run `B`'s own path (the kernels on a GPU) and are recorded as one operation each,
//! `sketched_linear` and `sketched_linear_backward`, rather than as the tensor operations of
//! the generic path, which would bypass `B`'s implementation.

use burn::tensor::{Tensor, TensorPrimitive};
use burn_profiler::Profiled;
use burn_profiler::TensorDesc;
use burn_profiler::record::{Call, desc};

use super::{
    Activation, KernelStrategy, SketchBackend, SketchGradients, SketchWeights, WantedGradients,
};

/// `B`'s primitive of a float tensor of the profiled backend (the same type).
fn inner<B: SketchBackend, const D: usize>(tensor: Tensor<Profiled<B>, D>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor.into_primitive().tensor()))
}

fn outer<B: SketchBackend, const D: usize>(tensor: Tensor<B, D>) -> Tensor<Profiled<B>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor.into_primitive().tensor()))
}

/// The shape and element type of a tensor, for the record.
fn describe<B: burn::tensor::backend::Backend, const D: usize>(
    tensor: &Tensor<B, D>,
) -> TensorDesc {
    TensorDesc {
        shape: tensor.dims().to_vec(),
        dtype: tensor.dtype(),
    }
}

/// The factors' records, in the order of their fields.
fn describe_weights<B: burn::tensor::backend::Backend>(
    weights: &SketchWeights<B>,
) -> Vec<TensorDesc> {
    [&weights.s1s, &weights.s2s, &weights.u1s, &weights.u2s]
        .into_iter()
        .map(describe)
        .collect()
}

fn inner_weights<B: SketchBackend>(weights: SketchWeights<Profiled<B>>) -> SketchWeights<B> {
    SketchWeights::from_primitives(weights.into_primitives())
}

impl<B: SketchBackend> SketchBackend for Profiled<B> {
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        let call = Call::start("sketched_linear", || {
            let mut inputs = vec![describe(&x)];
            inputs.extend(describe_weights(&weights));
            inputs
        });
        let output = B::sketched_linear(
            inner(x),
            inner_weights(weights),
            bias.map(inner),
            activation,
            strategy,
        );
        if let Some(call) = call {
            call.finish(|| vec![describe(&output)], || B::sync(&output.device()));
        }
        outer(output)
    }

    /// `B`'s (Flex's vectorised loops), recorded as the operation `activate`, so that a
    /// profiled model computes what the unprofiled one does.
    fn activate(z: Tensor<Self, 2>, activation: Activation) -> Tensor<Self, 2> {
        let call = Call::start("activate", || vec![describe(&z)]);
        let output = B::activate(inner(z), activation);
        if let Some(call) = call {
            call.finish(|| vec![describe(&output)], || B::sync(&output.device()));
        }
        outer(output)
    }

    /// `B`'s, recorded as the operation `activation_backward`.
    fn activation_backward(
        kept: Tensor<Self, 2>,
        grad_output: Tensor<Self, 2>,
        activation: Activation,
    ) -> Tensor<Self, 2> {
        let call = Call::start("activation_backward", || {
            vec![describe(&kept), describe(&grad_output)]
        });
        let output = B::activation_backward(inner(kept), inner(grad_output), activation);
        if let Some(call) = call {
            call.finish(|| vec![describe(&output)], || B::sync(&output.device()));
        }
        outer(output)
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
        strategy: KernelStrategy,
    ) -> SketchGradients<Self> {
        let device = x.device();
        let call = Call::start("sketched_linear_backward", || {
            let mut inputs = vec![describe(&x), describe(&grad_output)];
            inputs.extend(describe_weights(&weights));
            inputs
        });
        let grads = B::sketched_linear_backward(
            inner(x),
            inner_weights(weights),
            inner(grad_output),
            wanted,
            strategy,
        );
        let primitives = grads.into_primitives();
        if let Some(call) = call {
            let outputs = || primitives.iter().flatten().map(desc).collect();
            call.finish(outputs, || B::sync(&device));
        }
        SketchGradients::from_primitives(primitives)
    }
}
