//! The backend extension point for the sketched product.
//!
//! [`SkLinear::forward`](crate::SkLinear::forward) calls [`SketchBackend::sketched_linear`]
//! rather than tensor operations directly, so that a backend can supply a faster
//! implementation (the fused CubeCL kernels) without any change to the module or to user code.
//!
//! Implemented, each behind the crate feature of its backend:
//!
//! | backend | feature | path |
//! |---|---|---|
//! | `NdArray` | `ndarray` | its own: direct matrix products on the arrays |
//! | `Flex` | `flex` | its own: `gemm` calls on the buffers, scale, bias and activation fused |
//! | `FastFlex` (burn-fast-cpu) | `flex` | Flex's |
//! | every `CubeBackend` (`Wgpu`, `Cuda`, `Rocm`, ...) | `cubecl` (`wgpu`, `cuda`) | the `burn-sketch-kernels` kernels (activation in their output pass) or the tensor-op path, by [`KernelStrategy`] |
//! | `Fusion<B>` | `fusion` | one custom operation in the fusion stream, running `B`'s |
//! | `Profiled<B>` (burn-profiler) | `profile` | `B`'s, recorded as one operation |
//! | `Autodiff<B>` | always | one graph node whose backward runs `B`'s |
//!
//! `SkLinear<B>` compiles for exactly these. Burn's other backends (`Candle`, `LibTorch`, the
//! router and remote backends) are not implemented: the crate does not build them (LibTorch
//! needs a download of libtorch at build time) and untested code would be a claim the tests do
//! not keep. A backend with nothing faster gets the tensor-op path from an empty
//! `impl SketchBackend for MyBackend {}`, which the orphan rule allows only in this crate or the
//! backend's.

mod autodiff;
#[cfg(feature = "cubecl")]
mod cubecl;
#[cfg(feature = "flex")]
mod fast_flex;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "fusion")]
mod fusion;
mod gradients;
#[cfg(feature = "ndarray")]
mod ndarray;
#[cfg(feature = "profile")]
mod profiled;
mod strategy;
pub mod tensor_ops;
mod weights;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_fused::FusedBackend;

pub use crate::activation::{Activation, ActivationExt};
pub use gradients::{OPERANDS, SketchGradients, WantedGradients};
pub use strategy::KernelStrategy;
pub use weights::SketchWeights;
use weights::float;

/// A backend that can compute a sketched linear layer.
///
/// Its supertrait is burn-fused's [`FusedBackend`]: every backend the layers run on also has
/// the fused training operations (attention, layer norm, softmax, cross-entropy) that
/// burn-compress's modules call, so that a model generic over `B: SketchBackend` trains on
/// them with no other bound.
///
/// The provided methods are the tensor-op path, valid on any backend (and differentiable
/// through `Autodiff<B>`, since it only composes tensor operations). Backends with a faster
/// path override them.
pub trait SketchBackend: FusedBackend {
    /// `y = f(1/(2T) · Σ_t (x·S1_t·U1_t + x·U2_t·S2_t) + bias)` for `x` of shape
    /// `[n, d_input]`, returning `[n, d_output]`; `f` is the [`Activation`], which backends
    /// with their own path apply in the product's output pass.
    ///
    /// Callers guarantee that the shapes agree (as [`SkLinear`](crate::SkLinear) does).
    /// `strategy` picks the implementation where the backend has several.
    ///
    /// The backward ([`sketched_linear_backward`](Self::sketched_linear_backward)) is the
    /// product's alone: `Autodiff` applies the activation's derivative first, from the output
    /// (ReLU) or the pre-activation it keeps (GELU).
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        let _ = strategy;
        activation.apply(tensor_ops::sketched_linear(x, weights, bias))
    }

    /// `activation` of a tracked layer's pre-activation `z` (`[n, d_output]`): the forward
    /// that `Autodiff` runs for an activation whose derivative needs `z` (GELU), since it
    /// keeps `z` and cannot take the fused product. Burn's own activation unless the backend
    /// has a faster one.
    fn activate(z: Tensor<Self, 2>, activation: Activation) -> Tensor<Self, 2> {
        activation.apply(z)
    }

    /// `f'(z)·∂y`, the gradient that reaches the product's backward, from what the forward
    /// kept: the output for ReLU, the pre-activation for GELU. Burn's `relu_backward` or
    /// `gelu_backward` unless the backend has a faster one.
    fn activation_backward(
        kept: Tensor<Self, 2>,
        grad_output: Tensor<Self, 2>,
        activation: Activation,
    ) -> Tensor<Self, 2> {
        burn_activation_backward(kept, grad_output, activation)
    }
    /// The gradients of [`sketched_linear`](Self::sketched_linear) with respect to `x` and
    /// the factors, given the gradient of its output (`[n, d_output]`); only the `wanted` ones
    /// are computed. The bias gradient, a column sum of `grad_output`, is not included.
    ///
    /// `Autodiff<B>` calls this from its backward pass, so a backend that overrides it trains
    /// with its own kernels.
    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
        strategy: KernelStrategy,
    ) -> SketchGradients<Self> {
        let _ = strategy;
        tensor_ops::sketched_linear_backward(x, weights, grad_output, wanted)
    }
}

/// [`SketchBackend::activation_backward`] with Burn's `relu_backward` and `gelu_backward`: the
/// default, and the fallback of backends that override it for some element types.
pub(crate) fn burn_activation_backward<B: Backend>(
    kept: Tensor<B, 2>,
    grad_output: Tensor<B, 2>,
    activation: Activation,
) -> Tensor<B, 2> {
    let (kept, grad) = (
        kept.into_primitive().tensor(),
        grad_output.into_primitive().tensor(),
    );
    float(match activation {
        Activation::Identity => grad,
        Activation::Relu => B::relu_backward(kept, grad),
        Activation::Gelu => B::gelu_backward(kept, grad),
    })
}
