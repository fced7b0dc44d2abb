//! The backends whose fused operations are the compositions: Flex, NdArray, every CubeCL
//! backend and `Fusion<B>`.
//!
//! Why no kernels here yet: on the GPU backends the compositions are what Burn's own
//! autodiff would run (minus the graph nodes), and NdArray and Flex are the reference CPU
//! backends, FastFlex being their fast one.

use crate::FusedBackend;

#[cfg(feature = "flex")]
impl FusedBackend for burn::backend::Flex {}

#[cfg(feature = "ndarray")]
impl<E, I, Q> FusedBackend for burn_ndarray::NdArray<E, I, Q>
where
    burn_ndarray::NdArrayTensor:
        From<burn_ndarray::SharedArray<E>> + From<burn_ndarray::SharedArray<I>>,
    Self: burn::tensor::backend::Backend,
{
}

#[cfg(feature = "cubecl")]
impl<R, F, I, BT> FusedBackend for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::BoolElement,
{
}

#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend> FusedBackend for burn_fusion::Fusion<B> {}
