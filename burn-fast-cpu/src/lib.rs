//! Burn backends for the CPU, built on the kernels of
//! [burn-cpu-kernels](https://docs.rs/burn-cpu-kernels).
//!
//! - [`FastFlex`]: Burn's Flex backend with `bf16` and `f16` tensors computed at `f32`'s speed
//!   (products on AVX512-BF16, element-wise work through one vectorised conversion). Use it
//!   wherever Flex goes: `type B = Autodiff<FastFlex>` changes nothing else in a model.
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
#[cfg(feature = "memory")]
mod memory;

pub use fast_flex::FastFlex;
