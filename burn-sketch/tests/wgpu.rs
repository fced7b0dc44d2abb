//! `SkLinear` on the wgpu backend (in CI: Mesa's CPU Vulkan driver), and under autodiff.
//! One binary for all wgpu tests, so the kernels are compiled once per run.
//!
//! With burn's `fusion` on (burn-sketch's default), `Wgpu` is `Fusion<CubeBackend<..>>`, so
//! these tests go through the fusion custom operation, then the CubeCL kernels.

mod common;

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, NdArray, Wgpu};

type B = Wgpu;
type AB = Autodiff<Wgpu>;

/// Every test here checks the kernels, so none may leave the choice to the autotuner.
fn device() -> WgpuDevice {
    burn_sketch::backend::set_kernel_policy(burn_sketch::backend::KernelPolicy::Kernels);
    WgpuDevice::default()
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
fn wrong_input_width_panics() {
    common::wrong_input_width_panics::<B>(&device());
}

#[test]
fn kernels_match_tensor_ops() {
    common::backend_path_matches_tensor_ops::<B>(&device());
}

#[test]
fn training_step_matches_ndarray() {
    common::training_step_matches::<Autodiff<NdArray>, AB>(&NdArrayDevice::default(), &device());
}
