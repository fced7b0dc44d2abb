//! Batch-size search on NdArray, where the peak is the binary's exact heap peak. In a process
//! of its own: other tests allocating in the same process would move the peak. The budget check
//! is generic: the Flex and Wgpu modules run it too.

use std::ops::RangeInclusive;

use burn::backend::NdArray;
use burn::tensor::{Distribution, ElementConversion, Tensor};
use burn_memory::{
    BatchSearchResult, BatchSizeSearchConfig, BatchTrialFailure, BatchTrialOutcome, DeviceMemory,
    MemoryBudget, MemoryError, MemoryTracker,
};

type B = NdArray;

/// A "training step" whose memory grows with the batch: 1 MiB of touched f32 per sample, plus
/// a product of the same size.
fn step_on<D: DeviceMemory>(batch: usize, device: &D::Device) -> Result<(), BatchTrialFailure> {
    let x = Tensor::<D, 2>::random([batch, 256 * 1024], Distribution::Default, device);
    let y = x.clone().mul_scalar(2.0) + x;
    assert!(y.sum().into_scalar().elem::<f32>().is_finite());
    Ok(())
}

fn step(batch: usize) -> Result<(), BatchTrialFailure> {
    step_on::<B>(batch, &Default::default())
}

/// A search on `D` with a budget of what the device holds now (after the pools' cleanup, the
/// figure each trial starts from) plus `extra` bytes: the chosen size was tried and fit, its
/// peak within the budget; the size above it was tried and was over budget or ran out of
/// memory; and the chosen size is in `expected` (the step needs 1-3 MiB per sample).
pub(crate) fn search_respects_the_budget<D: DeviceMemory>(
    device: &D::Device,
    extra: u64,
    expected: RangeInclusive<usize>,
) -> BatchSearchResult {
    let tracker = MemoryTracker::<D>::new(device);
    tracker.reset_peak().unwrap();
    let base = tracker.peak().unwrap();
    let budget = base + extra;
    let search = BatchSizeSearchConfig::new(MemoryBudget::Bytes(budget))
        .with_max(1024)
        .init::<D>(device)
        .unwrap();
    let result = search.run(|batch| step_on::<D>(batch, device)).unwrap();
    eprintln!("base {base}, {result}");
    assert_eq!(result.budget, budget);
    let chosen = result
        .trials
        .iter()
        .find(|t| t.batch_size == result.batch_size && t.outcome == BatchTrialOutcome::Fits)
        .expect("the chosen size was tried and fit");
    assert!(chosen.peak <= budget, "{result}");
    assert_eq!(result.peak, chosen.peak, "{result}");
    // The next size up was tried and was over budget (or failed).
    let next = result
        .trials
        .iter()
        .find(|t| t.batch_size == result.batch_size + 1)
        .unwrap_or_else(|| panic!("the size above the result was tried: {result}"));
    match &next.outcome {
        BatchTrialOutcome::OverBudget => assert!(next.peak > budget, "{result}"),
        BatchTrialOutcome::OutOfMemory(_) => {}
        BatchTrialOutcome::Fits => panic!("the size above the result fit: {result}"),
    }
    assert!(
        expected.contains(&result.batch_size),
        "{} MiB at 1-3 MiB per sample should give {expected:?}, got {}",
        extra >> 20,
        result.batch_size
    );
    result
}

#[test]
fn search_respects_the_budget_and_recovers_from_out_of_memory() {
    crate::own_process::in_own_process(
        "batch_search::search_respects_the_budget_and_recovers_from_out_of_memory",
        budget_and_recovery,
    );
}

fn budget_and_recovery() {
    let device = Default::default();

    // Budget: the current process plus 80 MiB. Each sample needs 2-3 MiB at the peak.
    let result = search_respects_the_budget::<B>(&device, 80 * 1024 * 1024, 10..=40);
    let next = result
        .trials
        .iter()
        .find(|t| t.batch_size == result.batch_size + 1)
        .unwrap();
    assert_eq!(next.outcome, BatchTrialOutcome::OverBudget, "{result}");

    // An out-of-memory failure, returned or panicked, is contained and counts as "too big".
    let search = BatchSizeSearchConfig::new(MemoryBudget::FractionOfDevice(1.0))
        .with_max(64)
        .init::<B>(&device)
        .unwrap();
    let result = search
        .run(|batch| {
            if batch > 20 {
                panic!("wgpu: Failed to allocate buffer: Out of Memory (batch {batch})");
            }
            if batch == 20 {
                return Err(BatchTrialFailure::OutOfMemory(
                    "CUDA_ERROR_OUT_OF_MEMORY".into(),
                ));
            }
            step(batch.min(4))
        })
        .unwrap();
    assert_eq!(result.batch_size, 19, "{result}");
    assert!(
        result
            .trials
            .iter()
            .any(|t| t.batch_size == 32 && matches!(t.outcome, BatchTrialOutcome::OutOfMemory(_)))
    );

    // On multiples of 4 only, the same failures give 16, found without trying 17-19.
    let search = BatchSizeSearchConfig::new(MemoryBudget::FractionOfDevice(1.0))
        .with_max(64)
        .with_start(4)
        .with_multiple_of(4)
        .init::<B>(&device)
        .unwrap();
    let result = search
        .run(|batch| {
            if batch >= 20 {
                return Err(BatchTrialFailure::OutOfMemory(
                    "CUDA_ERROR_OUT_OF_MEMORY".into(),
                ));
            }
            step(batch.min(4))
        })
        .unwrap();
    assert_eq!(result.batch_size, 16, "{result}");
    assert!(
        result.trials.iter().all(|t| t.batch_size % 4 == 0),
        "{result}"
    );

    // Nothing fits: an error that names the smallest size.
    let search = BatchSizeSearchConfig::new(MemoryBudget::Bytes(1))
        .init::<B>(&device)
        .unwrap();
    let err = search.run(step).unwrap_err();
    assert!(
        matches!(err, MemoryError::NothingFits { batch_size: 1, .. }),
        "{err}"
    );

    // A panic that is not about memory is a bug, and is not swallowed.
    let search = BatchSizeSearchConfig::new(MemoryBudget::FractionOfDevice(1.0))
        .init::<B>(&device)
        .unwrap();
    let bug = std::panic::catch_unwind(|| search.run(|_| panic!("index out of bounds")));
    assert!(bug.is_err());

    // Bad settings are refused.
    assert!(
        BatchSizeSearchConfig::new(MemoryBudget::Bytes(0))
            .init::<B>(&device)
            .is_err()
    );
    assert!(
        BatchSizeSearchConfig::new(MemoryBudget::FractionOfDevice(1.5))
            .init::<B>(&device)
            .is_err()
    );
    assert!(
        BatchSizeSearchConfig::new(MemoryBudget::Bytes(1))
            .with_start(0)
            .init::<B>(&device)
            .is_err()
    );
}
