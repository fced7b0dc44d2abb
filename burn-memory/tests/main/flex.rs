//! The memory tools on Flex, Burn's pure-Rust CPU backend: exact heap bytes (the binary
//! installs `CountingAllocator`) per dtype, mixed precision in f16 and bf16 on the CPU,
//! segment checkpointing, batch-size search and chunked inference.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_memory::{MemoryTracker, Precision};

type A = Autodiff<Flex>;

const MIB: u64 = 1 << 20;

/// Exact heap figures, so in a process of its own (other tests' allocations would move them).
#[test]
fn tracker_counts_flex_tensors_by_their_dtype() {
    crate::own_process::in_own_process(
        "flex::tracker_counts_flex_tensors_by_their_dtype",
        heap_counts_by_dtype,
    );
}

fn heap_counts_by_dtype() {
    let device = Default::default();
    let tracker = MemoryTracker::<Flex>::new(&device);
    // 4 Mi elements: 16 MiB in f32, 8 MiB once cast to f16 (the f32 source freed).
    let (held, report) = tracker
        .profile(|| Tensor::<Flex, 1>::ones([4 << 20], &device).cast(DType::F16))
        .unwrap();
    assert_eq!(held.dtype(), DType::F16);
    let grown = report.after.in_use - report.before.in_use;
    assert!(
        (8 * MIB..8 * MIB + MIB).contains(&grown),
        "an f16 tensor of 4 Mi elements left {grown} bytes in use"
    );
    // The f32 source and its f16 copy coexist during the cast, so the peak holds both. Flex's
    // cast goes through intermediate copies (56 MiB at its peak in burn-flex 0.21), so only
    // that lower bound is this crate's claim.
    let peak = report.peak_increase();
    assert!(
        peak >= 24 * MIB,
        "the peak rose by {peak} bytes, less than the f32 source and its f16 copy"
    );
    drop(held);
}

#[test]
fn flex_computes_in_half_precision() {
    let device = Default::default();
    assert!(Flex::supports_dtype(&device, DType::F16));
    assert!(Flex::supports_dtype(&device, DType::BF16));
}

#[test]
fn f16_training_reduces_the_loss() {
    crate::mixed_precision::training_reduces_the_loss::<A>(&Default::default(), Precision::F16);
}

#[test]
fn bf16_training_reduces_the_loss() {
    crate::mixed_precision::training_reduces_the_loss::<A>(&Default::default(), Precision::Bf16);
}

#[test]
fn batch_norm_statistics_stay_f32_under_f16() {
    crate::mixed_precision::batch_norm_statistics_stay_f32::<A>(
        &Default::default(),
        Precision::F16,
    );
}

#[test]
fn batch_norm_statistics_stay_f32_under_bf16() {
    crate::mixed_precision::batch_norm_statistics_stay_f32::<A>(
        &Default::default(),
        Precision::Bf16,
    );
}

#[test]
fn an_injected_infinity_skips_an_f16_step() {
    crate::mixed_precision::an_injected_infinity_skips_the_step::<A>(
        &Default::default(),
        Precision::F16,
    );
}

#[test]
fn segmented_gradients_match_the_plain_backward_on_flex() {
    crate::segments::gradients_match_the_plain_backward::<A>(&Default::default());
}

#[test]
fn batch_norm_segments_match_the_plain_backward_on_flex() {
    crate::segments::batch_norm_gradients_match_the_plain_backward::<A>(&Default::default());
}

#[test]
fn segments_update_running_statistics_once_on_flex() {
    crate::segments::running_statistics_are_updated_once::<A>(&Default::default());
}

/// In a process of its own: Flex's generator is the whole process's.
#[test]
fn segments_reproduce_dropout_masks_on_flex() {
    crate::own_process::in_own_process("flex::segments_reproduce_dropout_masks_on_flex", || {
        crate::segments::dropout_masks_are_reproduced::<A>(&Default::default())
    });
}

#[test]
fn tuple_state_segments_match_the_plain_backward_on_flex() {
    crate::segments::tuple_state_gradients_match_the_plain_backward::<A>(&Default::default());
}

#[test]
fn f16_segments_match_the_f16_plain_backward() {
    crate::segments::half_precision_segments_match_the_plain_backward::<A>(
        &Default::default(),
        Precision::F16,
    );
}

/// Exact heap peaks, so in a process of its own (other tests' allocations would move them).
#[test]
fn batch_size_search_respects_the_budget_on_flex() {
    crate::own_process::in_own_process(
        "flex::batch_size_search_respects_the_budget_on_flex",
        || {
            // Each sample needs 2-3 MiB at the peak, as on NdArray.
            crate::batch_search::search_respects_the_budget::<Flex>(
                &Default::default(),
                80 * MIB,
                10..=40,
            );
        },
    );
}

#[test]
fn chunked_inference_equals_one_pass_and_rejects_bad_chunks_on_flex() {
    crate::ndarray::chunked_equals_one_pass_and_rejects_bad_chunks::<A>(&Default::default());
}

#[test]
fn chunked_inference_rejects_changing_widths_and_passes_empty_inputs_on_flex() {
    crate::ndarray::chunked_rejects_changing_widths_and_passes_empty_inputs::<Flex>(
        &Default::default(),
    );
}
