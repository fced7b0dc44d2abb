//! burn-compress's transformer pieces, `Converter` and `PerformerAttention` on the wgpu backend
//! (in CI: Mesa's CPU Vulkan driver), through the backend-generic checks of `transformer` and
//! `performer`. With burn's `fusion` on, `Wgpu` is `Fusion<CubeBackend<..>>`, so the sketched
//! layers go through the fusion custom operation, then the CubeCL kernels.

use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Wgpu};

use crate::close as common;

type B = Wgpu;
type AB = Autodiff<Wgpu>;

fn device() -> WgpuDevice {
    WgpuDevice::default()
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
