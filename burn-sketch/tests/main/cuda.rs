//! `SkLinear` on CUDA, and under autodiff: the wgpu suite (the `wgpu` module) on a GPU.
//!
//! Built only with `--features cuda`, and it needs a CUDA device to run: CI compiles it, the
//! binary runs on a GPU machine (`cargo test -p burn-sketch --features cuda --release
//! --no-run`, then run the `main-*` binary it names with the filter `cuda::`).

use crate::common;

use burn::backend::cuda::CudaDevice;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, Cuda, NdArray};
use burn_sketch::backend::KernelStrategy;

type B = Cuda;
type AB = Autodiff<Cuda>;

/// Every test here checks the kernels, so none may leave the choice to the autotuner. The
/// references here run Burn's CUDA matmul, which uses TF32 for `f32` (see `TOLERANCE`).
const KERNELS: KernelStrategy = KernelStrategy::Kernels;

fn device() -> CudaDevice {
    common::TOLERANCE.store(3e-3f32.to_bits(), std::sync::atomic::Ordering::Relaxed);
    CudaDevice::default()
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
