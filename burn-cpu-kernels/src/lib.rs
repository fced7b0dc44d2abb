//! CPU kernels on the instructions this CPU has, chosen at run time: matrix products in `f32`,
//! `bf16` (with `f32` accumulation) and `int8` (with `i32` accumulation), fused attention and
//! the element-wise and row operations a transformer spends the rest of its time in.
//!
//! `gemm` (behind Flex's `matmul` and burn-sketch's Flex path) has no `bf16` or `int8` kernels
//! and no fused epilogue: Flex multiplies `bf16` through `f32` copies, and Burn 0.21's
//! quantized tensors are dequantized before a product. This crate supplies what they lack:
//!
//! | product | AVX-512 path (detected at run time) | portable path |
//! |---|---|---|
//! | [`bf16::matmul`] | `vdpbf16ps` (AVX512-BF16): two `bf16` products summed into `f32` per lane | `f32` copies multiplied by `gemm` |
//! | [`int8::matmul`] | `vpdpbusd` (AVX512-VNNI): four `u8 × i8` products summed into `i32` per lane | the same integer sums, one at a time |
//! | [`sgemm::matmul`] | `vfmadd231ps` on a 14 × 32 tile (the bias and activation in its store) | `gemm`, then the epilogue |
//!
//! The kernels pack their operands into panels, keep a tile of the output in registers for
//! the whole depth, and write it once (`int8` applies its scales and bias in that write).
//! AMX is reported by [`isa::cpu_has_amx`] but not used: no machine this project runs on has it, and
//! code we cannot run is a claim we cannot test.
//!
//! Every kernel has a default form, on the instructions this CPU has, and an `_on` form that
//! takes an [`Isa`]: [`Isa::PORTABLE`] runs the portable path in the same process, the same
//! results within each precision's tolerance, for tests and for comparing speeds.
//!
//! - [`bf16`]: the `bf16` product ([`bf16::matmul`]) and its `f64` reference;
//! - [`int8`]: quantized matrices and the `int8` product ([`int8::matmul`]);
//! - [`mod@activation`]: the [`Activation`] a product applies as it stores its output;
//! - [`attention`]: fused scaled-dot-product attention ([`attention::forward`]), Burn's semantics,
//!   and for training [`attention::forward_train`] (with the log-sum-exp) and
//!   [`attention::backward`] (FlashAttention-2 style, memory linear in the lengths), with dropout;
//! - [`sgemm`]: the `f32` product with a fused bias and activation ([`sgemm::matmul`]);
//! - [`math`]: `exp`, `erf`, `tanh` and the exact GELU over slices, vectorised (within an ulp);
//! - [`softmax`]: softmax, log-softmax (masked as Burn's `mask_fill(−∞)`) and their backward
//!   over rows;
//! - [`layer_norm`]: layer normalisation over rows and its backward;
//! - [`cross_entropy`]: a language model's loss from logits over rows and its backward,
//!   keeping one log-sum-exp per row, no probabilities;
//! - [`peak`]: this CPU's measured peak per kind of product, for benchmarks;
//! - [`convert`]: [`StoredFloat`] (`f32` or `bf16` stored, `f32` computed) and the
//!   `f32` ↔ half conversions over slices;
//! - [`isa`]: the [`Isa`] every kernel's `_on` form takes, and this CPU's ([`Isa::detected`]);
//! - [`view`]: [`MatRef`] and [`View4`], strided views, and [`gemm()`], one `gemm` call on them;
//! - [`testing`]: the seeded inputs and `f64` comparisons the tests and benchmarks share.
//!
//! The intrinsics live under `x86_64/`, one file per kernel family, behind
//! `cfg(target_arch = "x86_64")`; the portable code sits beside each kernel's dispatch.

pub mod activation;
pub mod attention;
pub mod bf16;
mod blocking;
pub mod convert;
pub mod cross_entropy;
pub mod int8;
pub mod isa;
pub mod layer_norm;
pub mod math;
pub mod peak;
pub mod sgemm;
pub mod softmax;
pub mod testing;
pub mod view;
#[cfg(target_arch = "x86_64")]
mod x86_64;

pub use activation::Activation;
pub use convert::StoredFloat;
pub use isa::Isa;
pub use view::{GemmElement, MatRef, View4, gemm};
