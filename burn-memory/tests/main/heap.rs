//! The tracker on NdArray with the binary's `CountingAllocator`: exact heap figures, in a
//! process of their own (other tests' allocations would move them).

use burn::backend::NdArray;
use burn::tensor::Tensor;
use burn_memory::MemoryTracker;

const MIB: u64 = 1 << 20;

#[test]
fn heap_counts_are_exact_and_the_peak_sees_a_transient_tensor() {
    crate::own_process::in_own_process(
        "heap::heap_counts_are_exact_and_the_peak_sees_a_transient_tensor",
        exact_heap_counts,
    );
}

fn exact_heap_counts() {
    assert!(burn_memory::CountingAllocator::is_installed());
    let device = Default::default();
    let tracker = MemoryTracker::<NdArray>::new(&device);

    // 16 Mi f32 values = 64 MiB held, then a 32 MiB transient freed before the closure ends.
    let (held, report) = tracker
        .profile(|| {
            let held = Tensor::<NdArray, 1>::zeros([16 << 20], &device);
            let transient = Tensor::<NdArray, 1>::ones([8 << 20], &device);
            let total = transient.sum().into_scalar();
            assert_eq!(total, (8 << 20) as f32);
            held
        })
        .unwrap();
    let grown = report.after.in_use - report.before.in_use;
    // The held tensor and little else: the test's other threads allocate almost nothing.
    assert!(
        (64 * MIB..64 * MIB + MIB).contains(&grown),
        "in use grew by {grown} bytes"
    );
    let increase = report.peak_increase();
    assert!(
        (96 * MIB..96 * MIB + 2 * MIB).contains(&increase),
        "peak rose by {increase} bytes"
    );
    // Reserved is the resident memory, which holds the heap.
    assert!(report.after.reserved >= 64 * MIB);

    // Freeing is seen at once, and a reset starts the peak at what is in use.
    drop(held);
    let after_drop = tracker.usage().unwrap().in_use;
    assert!(report.after.in_use - after_drop >= 64 * MIB);
    tracker.reset_peak().unwrap();
    let peak = tracker.peak().unwrap();
    assert!(
        peak < after_drop + MIB,
        "peak {peak} after reset, in use {after_drop}"
    );

    // Flex keeps its tensors on the same heap, counted the same way.
    let flex = MemoryTracker::<burn::backend::Flex>::new(&Default::default());
    let (held, report) = flex
        .profile(|| Tensor::<burn::backend::Flex, 1>::zeros([8 << 20], &Default::default()))
        .unwrap();
    let grown = report.after.in_use - report.before.in_use;
    assert!(
        (32 * MIB..32 * MIB + MIB).contains(&grown),
        "Flex: in use grew by {grown} bytes"
    );
    drop(held);
}
