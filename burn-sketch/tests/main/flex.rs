//! `SkLinear` on Flex, Burn's pure-Rust CPU backend (the tensor-op path), and under autodiff:
//! the backend-generic checks.

use burn::backend::flex::FlexDevice;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, Flex, NdArray};
use burn_sketch::backend::KernelStrategy;

use crate::common;

type B = Flex;
type AB = Autodiff<Flex>;
const DEVICE: FlexDevice = FlexDevice;
/// Flex has one implementation of the product; it takes the default strategy and ignores it.
const STRATEGY: KernelStrategy = KernelStrategy::Autotune;

backend_suite!(B, AB, DEVICE, STRATEGY);

#[test]
fn training_step_matches_ndarray() {
    common::training_step_matches::<Autodiff<NdArray>, AB>(
        &NdArrayDevice::default(),
        &DEVICE,
        STRATEGY,
    );
}
