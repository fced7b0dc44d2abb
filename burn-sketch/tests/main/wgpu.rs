//! `SkLinear` on the wgpu backend (in CI: Mesa's CPU Vulkan driver), and under autodiff; then
//! Panther checkpoints there, through the backend-generic checks of `common`. (burn-compress's
//! tests run its transformer pieces, `Converter` and `PerformerAttention` on wgpu.)
//!
//! With burn's `fusion` on (burn-sketch's default), `Wgpu` is `Fusion<CubeBackend<..>>`, so
//! these tests go through the fusion custom operation, then the CubeCL kernels.

use crate::common;

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, NdArray, Wgpu};
use burn_sketch::backend::KernelStrategy;

type B = Wgpu;
type AB = Autodiff<Wgpu>;

/// The `SkLinear` tests here check the kernels, so none leaves the choice to the autotuner (the
/// transformer and Performer tests build their layers with the default strategy).
const KERNELS: KernelStrategy = KernelStrategy::Kernels;

fn device() -> WgpuDevice {
    WgpuDevice::default()
}

backend_suite!(B, AB, device(), KERNELS);

#[test]
fn training_step_matches_ndarray() {
    common::training_step_matches::<Autodiff<NdArray>, AB>(
        &NdArrayDevice::default(),
        &device(),
        KERNELS,
    );
}

/// Under the default strategy CubeCL's autotuner times the kernels against the tensor-op path
/// (Burn's matmuls, themselves autotuned) per shape class and keeps the faster: whichever it
/// keeps, forward, backward and a training step give the tensor-op path's numbers.
#[test]
fn autotuned_layer_matches_tensor_ops() {
    common::backend_path_matches_tensor_ops::<B>(&device(), KernelStrategy::Autotune);
    common::training_step_matches::<Autodiff<NdArray>, AB>(
        &NdArrayDevice::default(),
        &device(),
        KernelStrategy::Autotune,
    );
}

#[test]
fn panther_checkpoints_match_ndarray() {
    common::panther_checkpoints_match_ndarray::<B>(&device(), KERNELS);
}
