//! [`Activation`] on Burn tensors.

use burn::tensor::Tensor;
use burn::tensor::activation;
use burn::tensor::backend::Backend;

pub use burn_cpu_kernels::Activation;

/// [`Activation`] applied with Burn's tensor operations: the path of backends and layers
/// without a product that applies it in its store.
pub trait ActivationExt {
    /// `f(tensor)`, element-wise.
    fn apply<B: Backend, const D: usize>(self, tensor: Tensor<B, D>) -> Tensor<B, D>;
}

impl ActivationExt for Activation {
    fn apply<B: Backend, const D: usize>(self, tensor: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Activation::Identity => tensor,
            Activation::Relu => activation::relu(tensor),
            Activation::Gelu => activation::gelu(tensor),
        }
    }
}
