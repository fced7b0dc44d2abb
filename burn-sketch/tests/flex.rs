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

#[test]
fn forward_matches_references() {
    common::forward_matches_references::<B>(&DEVICE, STRATEGY);
}

#[test]
fn gradients_match_closed_form() {
    common::gradients_match_closed_form::<AB>(&DEVICE, STRATEGY);
}

#[test]
fn init_is_seeded() {
    common::init_is_seeded::<B>(&DEVICE, STRATEGY);
}

#[test]
fn optimizer_leaves_sketches_alone() {
    common::optimizer_leaves_sketches_alone::<AB>(&DEVICE, STRATEGY);
}

#[test]
fn record_round_trip_is_exact() {
    common::record_round_trip_is_exact::<B>(&DEVICE, STRATEGY);
}

#[test]
fn wrong_input_width_panics() {
    common::wrong_input_width_panics::<B>(&DEVICE, STRATEGY);
}

#[test]
fn training_step_matches_ndarray() {
    common::training_step_matches::<Autodiff<NdArray>, AB>(
        &NdArrayDevice::default(),
        &DEVICE,
        STRATEGY,
    );
}
