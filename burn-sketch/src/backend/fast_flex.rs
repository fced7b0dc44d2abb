//! `SketchBackend` for [`FastFlex`]: Flex's own path (the `bf16` products already on
//! [`bf16`](burn_cpu_kernels::bf16)), on the same primitives.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{
    Activation, KernelStrategy, SketchBackend, SketchGradients, SketchWeights, WantedGradients,
};
use burn_fast_cpu::FastFlex;

/// The same tensor, as Flex's (the primitive is shared).
fn flex<const D: usize>(tensor: Tensor<FastFlex, D>) -> Tensor<Flex, D> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor.into_primitive().tensor()))
}

/// The same tensor, as `FastFlex`'s (the inverse of [`flex`]).
fn fast_flex<const D: usize>(tensor: Tensor<Flex, D>) -> Tensor<FastFlex, D> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor.into_primitive().tensor()))
}

fn flex_weights(weights: SketchWeights<FastFlex>) -> SketchWeights<Flex> {
    SketchWeights::from_primitives(weights.into_primitives())
}

impl SketchBackend for FastFlex {
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        fast_flex(Flex::sketched_linear(
            flex(x),
            flex_weights(weights),
            bias.map(flex),
            activation,
            strategy,
        ))
    }

    fn activate(z: Tensor<Self, 2>, activation: Activation) -> Tensor<Self, 2> {
        fast_flex(Flex::activate(flex(z), activation))
    }

    fn activation_backward(
        kept: Tensor<Self, 2>,
        grad_output: Tensor<Self, 2>,
        activation: Activation,
    ) -> Tensor<Self, 2> {
        fast_flex(Flex::activation_backward(
            flex(kept),
            flex(grad_output),
            activation,
        ))
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
        strategy: KernelStrategy,
    ) -> SketchGradients<Self> {
        let grads = Flex::sketched_linear_backward(
            flex(x),
            flex_weights(weights),
            flex(grad_output),
            wanted,
            strategy,
        );
        SketchGradients::from_primitives(grads.into_primitives())
    }
}
