//! Randomized sketched layers for Burn.
//!
//! [`SkLinear`] is a drop-in for `burn::nn::Linear` whose weight is the average of
//! `num_terms` low-rank sketched terms (the layer of the PyTorch library Panther):
//!
//! ```text
//! y = 1/(2T) · Σ_t ( x·S1_t·U1_t + x·U2_t·S2_t ) + bias
//! ```
//!
//! `S1_t` (`[d_in, k]`) and `S2_t` (`[k, d_out]`) are trained; `U1_t`, `U2_t` are fixed random
//! sign sketches. For `k ≪ d_in, d_out` the layer has far fewer parameters and FLOPs than the
//! dense weight it replaces, and at initialisation it is an unbiased estimate of a dense layer
//! (drawn at random, or an existing one via [`SkLinear::from_linear`]).
//!
//! The product runs through [`SketchBackend`], so backends with a faster implementation
//! (the fused CubeCL kernels, the Flex path on `gemm`) are picked up with no change to model
//! code.
//!
//! - [`SkLinear`], [`SkConv2d`]: the layers and their configurations ([`SkLinearConfig`],
//!   [`SkConv2dConfig`], [`SketchInit`], [`ParamCounts`]); [`FixedSketch`]: the fixed sign
//!   sketches they hold, recorded by seed;
//! - [`backend`]: [`SketchBackend`], one module per backend (NdArray, Flex, `FastFlex`, CubeCL,
//!   fusion, `Profiled`, `Autodiff`), with [`SketchWeights`] and [`KernelStrategy`];
//! - [`panther`]: Panther's checkpoints, read and written;
//! - [`ActivationExt`]: the fused [`Activation`] on Burn tensors;
//! - [`SketchError`]: every error of the crate.
//!
//! Model-level tools built on these layers (`AnyLinear`, attention, conversion, rank search,
//! pruning) are [burn-compress](https://docs.rs/burn-compress); the randomized linear algebra
//! is [burn-randnla](https://docs.rs/burn-randnla); the CPU kernels and backends are
//! [burn-cpu-kernels](https://docs.rs/burn-cpu-kernels) and [burn-fast-cpu](https://docs.rs/burn-fast-cpu).
//!
//! On `Wgpu`, the first use of a device (building a layer, a tensor) is where CubeCL looks for
//! a graphics adapter, and without one it panics on its device thread: programs that may run
//! where no Vulkan or Metal driver is installed call `burn_memory::wgpu_adapter()` first, which
//! returns an error saying what to install.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::tensor::Tensor;
//! use burn_sketch::SkLinearConfig;
//!
//! type B = Autodiff<NdArray>;
//! let device = Default::default();
//! let layer = SkLinearConfig::new(64, 32, 2, 8).init::<B>(&device);
//! let x = Tensor::<B, 3>::ones([4, 10, 64], &device);
//! let y = layer.forward(x);
//! assert_eq!(y.dims(), [4, 10, 32]);
//! ```

#![warn(missing_docs)]

mod activation;
pub mod backend;
mod conv;
mod error;
mod fixed;
mod linear;
pub mod panther;

pub use activation::{Activation, ActivationExt};
pub use backend::{KernelStrategy, SketchBackend, SketchWeights};
pub use conv::{SkConv2d, SkConv2dConfig};
pub use error::SketchError;
pub use fixed::FixedSketch;
pub use linear::{ParamCounts, SkLinear, SkLinearConfig, SketchInit};

/// The workspace README's examples, compiled and run as doctests so that they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The crate README's example, likewise.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct CrateReadmeDoctests;
