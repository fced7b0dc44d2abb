//! The backend extension point for the sketched product.
//!
//! [`SkLinear::forward`](crate::SkLinear::forward) calls [`SketchBackend::sketched_linear`]
//! rather than tensor operations directly, so that a backend can supply a faster
//! implementation (the fused CubeCL kernels) without any change to the module or to user code.
//! Every backend gets the [tensor-op implementation](tensor_ops::sketched_linear) by default.
//!
//! Rust's orphan rule requires each implementation to live here, beside the trait; each is
//! behind the crate feature of its backend.

pub mod tensor_ops;
mod weights;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

pub use weights::SketchWeights;

/// A backend that can compute a sketched linear layer.
///
/// The provided method is the tensor-op path, valid on every backend (and differentiable
/// through `Autodiff<B>`, since it only composes tensor operations). Backends with a faster
/// path override it.
pub trait SketchBackend: Backend {
    /// `y = 1/(2T) · Σ_t (x·S1_t·U1_t + x·U2_t·S2_t) + bias` for `x` of shape
    /// `[n, d_input]`, returning `[n, d_output]`.
    ///
    /// Callers guarantee that the shapes agree (as [`SkLinear`](crate::SkLinear) does).
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Tensor<Self, 2> {
        tensor_ops::sketched_linear(x, weights, bias)
    }
}

impl<B, C> SketchBackend for burn_autodiff::Autodiff<B, C>
where
    B: SketchBackend,
    C: burn_autodiff::checkpoint::strategy::CheckpointStrategy,
{
}

#[cfg(feature = "ndarray")]
impl<E, I, Q> SketchBackend for burn_ndarray::NdArray<E, I, Q>
where
    burn_ndarray::NdArrayTensor:
        From<burn_ndarray::SharedArray<E>> + From<burn_ndarray::SharedArray<I>>,
    Self: Backend,
{
}

#[cfg(feature = "cubecl")]
impl<R, F, I, BT> SketchBackend for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::BoolElement,
    Self: Backend,
{
}

#[cfg(feature = "fusion")]
impl<B> SketchBackend for burn_fusion::Fusion<B> where B: burn_fusion::FusionBackend {}
