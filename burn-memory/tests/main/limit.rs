//! Releasing cached memory (`release_cached`) and the memory cap (`MemoryCap`), with their
//! measured effect: reserved bytes drop after a release; the cap refuses work past it, passes
//! work under it.

use burn::backend::{Flex, Wgpu};
use burn::tensor::{ElementConversion, Tensor};
use burn_memory::{DeviceMemory, MemoryCap, MemoryError, MemoryTracker, release_cached};

const MIB: u64 = 1 << 20;

/// On CubeCL the pools keep a freed tensor's pages; `release_cached` returns them.
#[test]
fn release_cached_lowers_reserved_on_wgpu() {
    let _device = crate::wgpu::exclusive();
    let device = Default::default();
    let kept = Tensor::<Wgpu, 2>::ones([256, 256], &device);
    {
        // Two 64 MiB tensors and their sum, then freed.
        let a = Tensor::<Wgpu, 2>::ones([4096, 4096], &device);
        let b = Tensor::<Wgpu, 2>::ones([4096, 4096], &device);
        let sum: f32 = (a + b).sum().into_scalar();
        assert_eq!(sum, 2.0 * 4096.0 * 4096.0);
    }
    let released = release_cached::<Wgpu>(&device).unwrap();
    eprintln!("wgpu: {released}");
    assert!(
        released.after.reserved < released.before.reserved,
        "reserved did not drop: {released}"
    );
    assert!(
        released.released() >= 64 * MIB,
        "less than one freed 64 MiB tensor came back: {released}"
    );
    // Live tensors keep their memory.
    assert!(released.after.in_use >= 256 * 256 * 4, "{released}");
    assert_eq!(kept.sum().into_scalar(), 256.0 * 256.0);
}

/// On a CPU backend the cache is glibc's: the free pages of many small freed tensors stay
/// resident (a live tensor allocated after them pins the heap's top) until `malloc_trim`.
/// Resident memory is the process's, so in a process of its own.
#[test]
fn release_cached_trims_the_heap_on_flex() {
    crate::own_process::in_own_process("limit::release_cached_trims_the_heap_on_flex", || {
        let device = Default::default();
        // 100,000 tensors of 1 KiB: 100 MB in small heap blocks.
        let small: Vec<Tensor<Flex, 1>> = (0..100_000)
            .map(|_| Tensor::<Flex, 1>::ones([256], &device))
            .collect();
        let pin = Tensor::<Flex, 1>::ones([256], &device);
        drop(small);
        let released = release_cached::<Flex>(&device).unwrap();
        eprintln!("flex: {released}");
        assert!(
            released.released() >= 50 * MIB,
            "less than half of 100 MB of freed small tensors left the resident set: {released}"
        );
        assert_eq!(pin.sum().into_scalar(), 256.0);
    });
}

/// `reserve` refuses before running and `run` after measuring, with `OverCap`; both pass
/// under the limit.
fn cap_refuses_past_and_passes_under<B: DeviceMemory>(device: &B::Device) {
    let in_use = MemoryTracker::<B>::new(device).usage().unwrap().in_use;
    let limit = in_use + 32 * MIB;
    let cap = MemoryCap::<B>::new(device, limit);
    assert_eq!(cap.limit(), limit);

    // Before running: 1 MiB fits, 64 MiB does not.
    cap.check().unwrap();
    cap.reserve(MIB).unwrap();
    match cap.reserve(64 * MIB) {
        Err(MemoryError::OverCap {
            limit: l, needed, ..
        }) => {
            assert_eq!(l, limit);
            assert!(needed >= in_use + 64 * MIB, "needed {needed}");
        }
        other => panic!("expected OverCap, got {other:?}"),
    }

    // Around running: a closure whose peak holds 64 MiB fails, one of 1 MiB passes.
    let over = cap.run(|| {
        let big = Tensor::<B, 2>::ones([4096, 4096], device);
        big.sum().into_scalar()
    });
    match over {
        Err(MemoryError::OverCap {
            limit: l, needed, ..
        }) => {
            assert_eq!(l, limit);
            assert!(needed >= in_use + 64 * MIB, "peak {needed}");
        }
        other => panic!("expected OverCap, got {other:?}"),
    }
    let (sum, report) = cap
        .run(|| {
            let small = Tensor::<B, 2>::ones([512, 512], device);
            small.sum().into_scalar().elem::<f32>()
        })
        .unwrap();
    assert_eq!(sum, 512.0 * 512.0);
    assert!(report.peak <= limit, "{report}");
}

#[test]
fn memory_cap_refuses_past_and_passes_under_on_wgpu() {
    let _device = crate::wgpu::exclusive();
    cap_refuses_past_and_passes_under::<Wgpu>(&Default::default());
}

/// Exact heap bytes are the whole process's, so in a process of its own.
#[test]
fn memory_cap_refuses_past_and_passes_under_on_flex() {
    crate::own_process::in_own_process(
        "limit::memory_cap_refuses_past_and_passes_under_on_flex",
        || cap_refuses_past_and_passes_under::<Flex>(&Default::default()),
    );
}
