//! [`CountingAllocator`]: exact heap accounting for CPU backends.
//!
//! CPU backends keep tensors on the heap, so the process's resident memory is only a proxy for
//! what they hold: it counts code and stacks, rounds to pages, and above all depends on the
//! allocator, which keeps freed memory for reuse (a second identical step raises it by nothing)
//! and maps fresh memory lazily. Counting the bytes of every allocation and free is exact and
//! cheap (two relaxed atomic operations per call), which is why PyTorch's allocators count too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static IN_USE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes allocated and not yet freed, and their peak,
/// around another allocator (the system's by default).
///
/// Installed as the program's `#[global_allocator]`, it makes [`MemoryTracker`] on CPU
/// backends (NdArray, Flex) report heap bytes in use and an exact heap peak, instead of the
/// process's resident memory and the kernel's page-level high-water mark. The counts cover
/// every thread of the process (data loaders included), like the resident figures they
/// replace.
///
/// ```
/// use burn_memory::CountingAllocator;
///
/// #[global_allocator]
/// static ALLOCATOR: CountingAllocator = CountingAllocator::system();
/// # fn main() {}
/// ```
///
/// Any other allocator can be wrapped: `CountingAllocator::new(mimalloc::MiMalloc)`.
///
/// [`MemoryTracker`]: crate::MemoryTracker
#[derive(Debug, Default)]
pub struct CountingAllocator<A = System> {
    inner: A,
}

impl CountingAllocator<System> {
    /// Counts around the system allocator.
    pub const fn system() -> Self {
        Self { inner: System }
    }
}

impl<A> CountingAllocator<A> {
    /// Counts around `inner`.
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }
}

impl CountingAllocator {
    /// Whether a `CountingAllocator` is this program's global allocator (it has counted an
    /// allocation), so that [`MemoryTracker`](crate::MemoryTracker) on CPU backends reports
    /// exact heap bytes rather than the process's resident memory.
    pub fn is_installed() -> bool {
        counts().is_some()
    }
}

fn allocated(bytes: usize) {
    let now = IN_USE.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
    PEAK.fetch_max(now, Ordering::Relaxed);
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

fn freed(bytes: usize) {
    IN_USE.fetch_sub(bytes as u64, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `inner`, which upholds `GlobalAlloc`'s
// contract; the counting only reads `layout` and the returned pointer's nullness.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees on `layout` are passed on.
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            allocated(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            allocated(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `inner` with `layout`, as the caller guarantees.
        unsafe { self.inner.dealloc(ptr, layout) };
        freed(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's guarantees on `ptr`, `layout` and `new_size` are passed on.
        let new = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Counted as the program sees it: one block that changed size.
            match new_size.checked_sub(layout.size()) {
                Some(grown) => allocated(grown),
                None => freed(layout.size() - new_size),
            }
        }
        new
    }
}

/// Heap bytes in use and their peak since the last [`reset_peak`], if a [`CountingAllocator`]
/// is the global allocator (it has counted at least one allocation).
pub(crate) fn counts() -> Option<(u64, u64)> {
    INSTALLED
        .load(Ordering::Relaxed)
        .then(|| (IN_USE.load(Ordering::Relaxed), PEAK.load(Ordering::Relaxed)))
}

/// Starts a new peak period at the bytes in use now.
pub(crate) fn reset_peak() {
    PEAK.store(IN_USE.load(Ordering::Relaxed), Ordering::Relaxed);
}
