//! Fused CubeCL kernels for the sketched matmul of `burn-sketch`.
//!
//! `burn-sketch`'s `SkLinear` computes `y = x·(S1·U1 + U2·S2)/(2T) + bias` for `T` terms of
//! rank `k`. On CubeCL backends (CUDA, wgpu, and their fusion wrappers) it runs the kernels
//! of this crate, forward and backward; on other backends it composes tensor operations.
//!
//! - [`mod@activation`]: the [`Activation`] the forward applies in its output pass;
//! - [`layout`]: how the kernels read Panther-layout factors (and their transposes) in place;
//! - [`gemm`]: the tiled product kernel with strided layouts, optional second product and bias;
//! - [`fused`]: the one-launch forward, `P = x·A` kept in shared memory;
//! - [`weights`]: the operands every launch shares ([`CubeWeights`], [`Operands`]);
//! - [`tune`]: which forward kernels run for a shape on a device;
//! - [`sketch`]: forward and backward as sequences of those launches;
//! - [`mod@reference`]: a plain-Rust implementation of the same maths, which the tests hold the
//!   kernels to.
//!
//! All kernels take their element type at launch (`f32`, `f16`, `bf16`, as the device
//! supports) and accumulate in `f32`. [`forward`] and [`backward`] check their operands'
//! shapes and element types first and return a [`KernelError`] for any that do not fit.

// No `missing_docs` lint: `#[cube]` generates undocumented companion items for every kernel.

pub mod activation;
mod error;
pub mod fused;
pub mod gemm;
pub mod layout;
pub mod reference;
pub mod sketch;
pub mod tune;
pub mod weights;

pub use activation::Activation;
pub use error::KernelError;
pub use sketch::{backward, forward, forward_with};
pub use tune::{ForwardPath, choose_forward_path};
pub use weights::{CubeWeights, Operands};
