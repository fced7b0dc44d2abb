//! `SkLinear` on the wgpu backend (in CI: Mesa's CPU Vulkan driver), and under autodiff; then
//! Panther checkpoints, the transformer pieces, `Converter` and `PerformerAttention` there,
//! through the backend-generic checks of `common`, `transformer` and `performer`. One binary
//! for all wgpu tests, so the kernels are compiled once per run.
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

#[test]
fn attention_matches_naive_reference() {
    let _serial = common::serial();
    crate::transformer::attention_matches_naive_reference::<AB>(&device());
}

#[test]
fn block_and_mlp_run_every_kind_and_train() {
    let _serial = common::serial();
    crate::transformer::block_and_mlp_run_every_kind_and_train::<AB>(&device(), None);
}

#[test]
fn conversion_keeps_untouched_layers_bit_exact() {
    let _serial = common::serial();
    crate::transformer::conversion_keeps_untouched_layers_bit_exact::<B>(&device());
}

#[test]
fn performer_forward_matches_reference() {
    crate::performer::forward_matches_reference::<B>(&device());
}

#[test]
fn performer_gradients_match_reference() {
    crate::performer::gradients_match_reference::<AB>(&device());
}

/// Panther's Performer checkpoints load onto Wgpu and give the outputs of Panther's math.
///
/// Under Burn 0.21's fusion, `s.transpose() - s` (`s` of shape `[n, 1]`, both operands
/// broadcast views of one tensor) is wrong for even `n` on Wgpu (right without fusion, and for
/// odd `n`). The causal softmax Performer's in-chunk decay was computed that way, and was
/// wrong in every chunk of even length (here 2); it now expands both operands first.
#[test]
fn performer_panther_fixture_matches_panther_math() {
    crate::performer::panther_fixture_matches_panther_math::<B>(&device());
}
