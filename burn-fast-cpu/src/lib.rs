//! Burn backends for the CPU, built on the kernels of
//! [burn-cpu-kernels](https://docs.rs/burn-cpu-kernels).
//!
//! - [`FastFlex`]: Burn's Flex backend with the operations models spend their time in on
//!   this project's kernels, in `f32`, `bf16` and `f16`: `linear` at any rank as one product
//!   (its backward too), small batched products, fused attention, vectorised activations,
//!   softmax, layer norm and `mask_fill`. Use it wherever Flex goes:
//!   `type B = Autodiff<FastFlex>` changes nothing else in a model.
//! - [`flex_view`]: Flex's tensors as the kernels' views (strided matrices, 4-D views,
//!   contiguous values), the one way from a Flex tensor to a kernel, which burn-sketch's Flex
//!   path uses too.
//! - With the `memory` feature, burn-memory's `DeviceMemory` and `DeviceTransfer` for it, so
//!   that the memory tools measure and place its tensors as Flex's.
//!
//! The forwarding of Burn's operation traits to Flex is generated, one file per trait, by
//! `cargo backend-ops`.
//!
//! ```
//! use burn::nn::LinearConfig;
//! use burn::tensor::{DType, Distribution, Tensor};
//! use burn_fast_cpu::FastFlex;
//!
//! let device = Default::default();
//! let layer = LinearConfig::new(64, 32).init::<FastFlex>(&device);
//! let weight = layer.weight.val().cast(DType::BF16);
//! let x = Tensor::<FastFlex, 2>::random([8, 64], Distribution::Default, &device);
//! // Burn's `linear` (what `nn::Linear::forward` calls): its product runs on AVX512-BF16.
//! let y = burn::tensor::module::linear(x.cast(DType::BF16), weight, None);
//! assert_eq!((y.dims(), y.dtype()), ([8, 32], DType::BF16));
//! ```

#![warn(missing_docs)]

mod fast_flex;
pub mod flex_view;
#[cfg(feature = "memory")]
mod memory;

pub use fast_flex::FastFlex;
