//! `SkLinear` on CUDA, and under autodiff: the wgpu suite (`tests/wgpu.rs`) on a GPU.
//!
//! Built only with `--features cuda`, and it needs a CUDA device to run: CI compiles it, the
//! binary runs on a GPU machine (`cargo test -p burn-sketch --features cuda --release
//! --no-run`, then run the `cuda-*` binary it names).
#![cfg(feature = "cuda")]

mod common;

use burn::backend::cuda::CudaDevice;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, Cuda, NdArray};

type B = Cuda;
type AB = Autodiff<Cuda>;

/// Every test here checks the kernels, so none may leave the choice to the autotuner. The
/// references here run Burn's CUDA matmul, which uses TF32 for `f32` (see `TOLERANCE`).
fn device() -> CudaDevice {
    burn_sketch::backend::set_kernel_policy(burn_sketch::backend::KernelPolicy::Kernels);
    common::TOLERANCE.store(3e-3f32.to_bits(), std::sync::atomic::Ordering::Relaxed);
    CudaDevice::default()
}

#[test]
fn forward_matches_references() {
    common::forward_matches_references::<B>(&device());
}

#[test]
fn gradients_match_closed_form() {
    common::gradients_match_closed_form::<AB>(&device());
}

#[test]
fn init_is_seeded() {
    common::init_is_seeded::<B>(&device());
}

#[test]
fn optimizer_leaves_sketches_alone() {
    common::optimizer_leaves_sketches_alone::<AB>(&device());
}

#[test]
fn record_round_trip_is_exact() {
    common::record_round_trip_is_exact::<B>(&device());
}

#[test]
fn kernels_match_tensor_ops() {
    common::backend_path_matches_tensor_ops::<B>(&device());
}

#[test]
fn training_step_matches_ndarray() {
    common::training_step_matches::<Autodiff<NdArray>, AB>(&NdArrayDevice::default(), &device());
}
